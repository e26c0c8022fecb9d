// Inference against training: the KV cache's logits after each token equal the training
// forward's for the same sequence (float and double, dense and MoE), a prompt fed in one pass
// equals one token at a time, generation past the context crops as nanoGPT does, and the
// sampler is reproducible, greedy at temperature 0 and keeps to its top-k.

#include "runtime/model/generate.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <span>
#include <stdexcept>
#include <vector>

#include "runtime/data/random.hpp"

namespace troupe {
namespace {

model_config small_config() {
  model_config m;
  m.n_layer = 2;
  m.n_head = 2;
  m.d_model = 16;
  m.context = 12;
  m.vocab = 256;
  return m;
}

/// GPT-2 initialisation plus noise on every parameter: logits far from uniform, so a wrong
/// cache row or position changes them visibly.
template <typename F>
void randomise(basic_gpt<F>& m, uint64_t seed) {
  m.init_params(seed);
  for (size_t i = 0; i < m.num_params(); ++i)
    m.params()[i] += static_cast<F>(0.3 * normal_at(seed, 99, i));
}

std::vector<token_id> some_tokens(size_t n, int vocab, uint64_t seed) {
  std::vector<token_id> t(n);
  for (size_t i = 0; i < n; ++i)
    t[i] = static_cast<token_id>(hash_words(seed, i, 5) % static_cast<uint64_t>(vocab));
  return t;
}

template <typename F>
std::vector<double> log_softmax(const F* logits, int V) {
  double mx = logits[0];
  for (int v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(logits[v]));
  double sum = 0;
  for (int v = 0; v < V; ++v) sum += std::exp(static_cast<double>(logits[v]) - mx);
  std::vector<double> out(static_cast<size_t>(V));
  for (int v = 0; v < V; ++v) out[v] = static_cast<double>(logits[v]) - mx - std::log(sum);
  return out;
}

/// The training forward's log-probabilities [T, V] of `tokens` (one sequence). It hands out
/// probabilities, not logits: equal log-softmax means logits equal up to a constant per row,
/// which is all that sampling and the loss see.
template <typename F>
std::vector<double> training_log_probs(basic_gpt<F>& m, const std::vector<token_id>& tokens) {
  const int T = static_cast<int>(tokens.size());
  const int V = m.config().vocab;
  const std::vector<token_id> targets(tokens.size(), 0);
  m.forward_loss(tokens.data(), targets.data(), 1, T);
  const F* p = m.last_probs();
  std::vector<double> out(static_cast<size_t>(T) * V);
  for (size_t i = 0; i < out.size(); ++i) out[i] = std::log(static_cast<double>(p[i]));
  return out;
}

/// |a - b| <= rel * max(|b|, 1) for every element (log-probabilities near 0 count absolutely).
void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rel,
                  const char* what) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1.0);
    if (err > worst) {
      worst = err;
      at = i;
    }
  }
  EXPECT_LE(worst, rel) << what << ": worst at " << at << ": " << a[at] << " vs " << b[at];
}

template <typename F>
class decoder_test : public testing::Test {};
using scalar_types = testing::Types<float, double>;
TYPED_TEST_SUITE(decoder_test, scalar_types);

// The check the issue asks for: the cached, incremental logits of every position against the
// full training forward of the same sequence, relative 1e-5. The first four tokens go in as
// one prefill (every row's logits asked for), the rest one at a time against the cache.
TYPED_TEST(decoder_test, incremental_logits_equal_the_training_forward) {
  using F = TypeParam;
  basic_gpt<F> m(small_config());
  randomise(m, 3);
  const int T = m.config().context, V = m.config().vocab;
  const std::vector<token_id> tokens = some_tokens(static_cast<size_t>(T), V, 1);
  kv_decoder<F> d(m);
  std::vector<F> logits(static_cast<size_t>(T) * V);
  const int prefill = 4;
  d.append(std::span(tokens).first(prefill), logits.data());
  for (int t = prefill; t < T; ++t) {
    const F* row = d.append(std::span(tokens).subspan(static_cast<size_t>(t), 1));
    std::copy(row, row + V, logits.begin() + static_cast<std::ptrdiff_t>(t) * V);
  }
  EXPECT_EQ(d.length(), T);
  std::vector<double> incremental;
  for (int t = 0; t < T; ++t) {
    const auto row = log_softmax(logits.data() + static_cast<size_t>(t) * V, V);
    incremental.insert(incremental.end(), row.begin(), row.end());
  }
  expect_close(incremental, training_log_probs(m, tokens), 1e-5, "log-probabilities");
}

// Raw logits: a prompt in one pass gives the same logits as the same tokens one at a time.
TYPED_TEST(decoder_test, prefill_in_one_pass_equals_one_token_at_a_time) {
  using F = TypeParam;
  basic_gpt<F> m(small_config());
  randomise(m, 4);
  const int T = m.config().context, V = m.config().vocab;
  const std::vector<token_id> tokens = some_tokens(static_cast<size_t>(T), V, 2);
  kv_decoder<F> whole(m), stepwise(m);
  std::vector<F> all(static_cast<size_t>(T) * V);
  const F* last = whole.append(tokens, all.data());
  EXPECT_EQ(last, all.data() + static_cast<size_t>(T - 1) * V);
  std::vector<double> a(all.begin(), all.end()), b;
  for (int t = 0; t < T; ++t) {
    const F* row = stepwise.append(std::span(tokens).subspan(static_cast<size_t>(t), 1));
    b.insert(b.end(), row, row + V);
  }
  expect_close(a, b, 1e-5, "logits");
}

// A vocabulary wider than the bytes (--vocab 300) and a cache that is cleared and refilled.
TEST(decoder, clear_starts_a_new_sequence) {
  model_config c = small_config();
  c.vocab = 300;
  basic_gpt<double> m(c);
  randomise(m, 5);
  kv_decoder<double> d(m);
  const std::vector<token_id> a = some_tokens(7, 300, 3), b = some_tokens(5, 300, 4);
  d.append(a);
  d.clear();
  EXPECT_EQ(d.length(), 0);
  const double* first = d.append(b);
  const std::vector<double> got(first, first + 300);
  kv_decoder<double> fresh(m);
  const double* want = fresh.append(b);
  for (int v = 0; v < 300; ++v) EXPECT_DOUBLE_EQ(got[v], want[v]);
}

// MoE blocks: with a capacity the training forward never reaches, the two agree; with a tight
// one (training would drop), inference still drops nothing, so a prompt in one pass equals
// the same tokens one at a time.
TEST(decoder, moe_matches_the_training_forward_where_it_drops_nothing) {
  model_config c = small_config();
  c.experts = 4;
  c.top_k = 2;
  c.capacity_factor = 4;  // = E: every queue holds every token
  basic_gpt<double> m(c);
  randomise(m, 6);
  const std::vector<token_id> tokens = some_tokens(static_cast<size_t>(c.context), 256, 5);
  kv_decoder<double> d(m);
  std::vector<double> incremental;
  for (int t = 0; t < c.context; ++t) {
    const double* row = d.append(std::span(tokens).subspan(static_cast<size_t>(t), 1));
    const auto lp = log_softmax(row, 256);
    incremental.insert(incremental.end(), lp.begin(), lp.end());
  }
  expect_close(incremental, training_log_probs(m, tokens), 1e-9, "MoE log-probabilities");
}

TEST(decoder, moe_drops_nothing_at_inference) {
  model_config c = small_config();
  c.experts = 4;
  c.top_k = 1;
  c.capacity_factor = 0.5;  // training would drop a good share of a sequence's tokens
  basic_gpt<double> m(c);
  randomise(m, 7);
  const std::vector<token_id> tokens = some_tokens(static_cast<size_t>(c.context), 256, 6);
  kv_decoder<double> whole(m), stepwise(m);
  std::vector<double> all(static_cast<size_t>(c.context) * 256), b;
  whole.append(tokens, all.data());
  for (int t = 0; t < c.context; ++t) {
    const double* row = stepwise.append(std::span(tokens).subspan(static_cast<size_t>(t), 1));
    b.insert(b.end(), row, row + 256);
  }
  expect_close(std::vector<double>(all.begin(), all.end()), b, 1e-9, "MoE logits");
}

TEST(decoder, refuses_what_does_not_fit) {
  basic_gpt<float> m(small_config());
  m.init_params(1);
  kv_decoder<float> d(m);
  EXPECT_THROW(d.append(std::vector<token_id>{}), std::invalid_argument);
  EXPECT_THROW(d.append(std::vector<token_id>{256}), std::invalid_argument);
  EXPECT_EQ(d.length(), 0);
  d.append(some_tokens(10, 256, 1));
  EXPECT_THROW(d.append(some_tokens(3, 256, 2)), std::invalid_argument);  // 13 > context 12
  EXPECT_EQ(d.length(), 10);
  d.append(some_tokens(2, 256, 2));
  EXPECT_EQ(d.length(), 12);
}

// Past the context every token is the greedy choice of the training forward over the last
// `context` tokens (nanoGPT's crop), which the decoder recomputes each step.
TEST(generate, past_the_context_crops_to_the_last_context_tokens) {
  basic_gpt<double> m(small_config());
  randomise(m, 8);
  const int T = m.config().context, V = m.config().vocab;
  const std::vector<token_id> prompt = some_tokens(5, V, 7);
  kv_decoder<double> d(m);
  token_sampler greedy(sampling_options{.temperature = 0});
  std::vector<token_id> streamed;
  const std::vector<token_id> out =
      generate(d, prompt, 3 * T, greedy, [&](token_id t) { streamed.push_back(t); });
  ASSERT_EQ(out.size(), static_cast<size_t>(3 * T));
  EXPECT_EQ(streamed, out);
  std::vector<token_id> seq = prompt;
  for (const token_id t : out) {
    const size_t from = seq.size() > static_cast<size_t>(T) ? seq.size() - T : 0;
    const std::vector<token_id> window(seq.begin() + static_cast<std::ptrdiff_t>(from), seq.end());
    const std::vector<double> lp = training_log_probs(m, window);
    const double* last = lp.data() + (window.size() - 1) * V;
    const auto best = static_cast<token_id>(std::max_element(last, last + V) - last);
    ASSERT_EQ(t, best) << "token " << seq.size() - prompt.size();
    seq.push_back(t);
  }
  // A prompt longer than the context: only its last T tokens count.
  std::vector<token_id> long_prompt = some_tokens(20, V, 9);
  token_sampler g1(sampling_options{.temperature = 0}), g2(sampling_options{.temperature = 0});
  const auto a = generate(d, long_prompt, 4, g1);
  const auto b = generate(d, std::span(long_prompt).last(static_cast<size_t>(T)), 4, g2);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(generate(d, prompt, 0, g1).empty());
  EXPECT_THROW(generate(d, std::span<const token_id>(), 1, g1), std::invalid_argument);
}

TEST(sampler, same_seed_same_tokens_another_seed_others) {
  basic_gpt<float> m(small_config());
  randomise(m, 9);
  kv_decoder<float> d(m);
  const std::vector<token_id> prompt = some_tokens(3, 256, 1);
  const auto run = [&](uint64_t seed) {
    token_sampler s(sampling_options{.temperature = 1.0, .top_k = 0, .seed = seed});
    return generate(d, prompt, 40, s);
  };
  EXPECT_EQ(run(1), run(1));
  EXPECT_NE(run(1), run(2));
}

TEST(sampler, temperature_zero_and_top_k_one_are_greedy) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  for (const auto& o : {sampling_options{.temperature = 0}, sampling_options{.top_k = 1}}) {
    token_sampler s(o);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(s.next(logits.data(), 5), 1u);  // lowest of the ties
  }
  token_sampler masked(sampling_options{.temperature = 0, .allowed = 3});
  EXPECT_EQ(masked.next(std::vector<float>{0, 1, 2, 9}.data(), 4), 2u);
}

TEST(sampler, draws_follow_the_softmax_within_the_top_k) {
  // p = softmax(logits / 0.5) over the three largest: the others are never drawn.
  const std::vector<double> logits = {0.0, std::log(3.0) / 2, -5.0, std::log(2.0) / 2, -9.0};
  token_sampler s(sampling_options{.temperature = 0.5, .top_k = 3, .seed = 11});
  std::map<token_id, int> seen;
  const int draws = 60000;
  for (int i = 0; i < draws; ++i) ++seen[s.next(logits.data(), 5)];
  EXPECT_EQ(s.draws(), static_cast<uint64_t>(draws));
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_EQ(seen.count(4), 0u);
  EXPECT_NEAR(seen[0] / double(draws), 1.0 / 6, 0.01);
  EXPECT_NEAR(seen[1] / double(draws), 3.0 / 6, 0.01);
  EXPECT_NEAR(seen[3] / double(draws), 2.0 / 6, 0.01);
  token_sampler wide(sampling_options{.seed = 3, .allowed = 2});
  for (int i = 0; i < 1000; ++i) EXPECT_LT(wide.next(logits.data(), 5), 2u);
}

TEST(sampler, refuses_bad_options) {
  EXPECT_THROW(token_sampler(sampling_options{.temperature = -1}), std::invalid_argument);
  EXPECT_THROW(token_sampler(sampling_options{.temperature = HUGE_VAL}), std::invalid_argument);
  EXPECT_THROW(token_sampler(sampling_options{.temperature = NAN}), std::invalid_argument);
  EXPECT_THROW(token_sampler(sampling_options{.top_k = -1}), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
