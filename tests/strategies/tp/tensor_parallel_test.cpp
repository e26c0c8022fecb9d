// Tensor parallelism against the single-rank GPT, the oracle: ranks are threads of this
// process, each with its own gloo communicator (through a store server on a free port)
// wrapped in a decorator that counts the all-reduces.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/model/gpt.hpp"
#include "runtime/optim/adamw.hpp"
#include "runtime/trainer.hpp"
#include "strategies/tensor_parallel/tp_gpt.hpp"
#include "strategies/tensor_parallel/tp_train.hpp"
#include "tests/strategies/tp/tp_fixtures.hpp"

namespace troupe::tensor_parallel {
namespace {

using namespace std::chrono_literals;

/// A decorator that counts the all-reduces (and floats) that pass through to a real one.
class counting_communicator final : public comm::communicator {
 public:
  explicit counting_communicator(comm::communicator& inner) : inner_(inner) {}
  const comm::comm_identity& identity() const override { return inner_.identity(); }
  void all_reduce(float* data, size_t count, comm::reduce_op op,
                  const comm::op_options& opts) override {
    ++all_reduces;
    floats += count;
    inner_.all_reduce(data, count, op, opts);
  }
  void broadcast(void* data, size_t bytes, int root, const comm::op_options& opts) override {
    ++others;
    inner_.broadcast(data, bytes, root, opts);
  }
  void barrier(const comm::op_options& opts) override {
    ++others;
    inner_.barrier(opts);
  }
  void reduce_scatter(const float* in, float* out, size_t count, comm::reduce_op op,
                      const comm::op_options& opts) override {
    ++others;
    inner_.reduce_scatter(in, out, count, op, opts);
  }
  void all_gather(const void* in, void* out, size_t bytes, const comm::op_options& opts) override {
    ++others;
    inner_.all_gather(in, out, bytes, opts);
  }
  void all_to_all(const void* in, void* out, size_t bytes_per_rank,
                  const comm::op_options& opts) override {
    ++others;
    inner_.all_to_all(in, out, bytes_per_rank, opts);
  }
  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes, const comm::op_options& opts) override {
    ++others;
    inner_.all_to_allv(in, send_bytes, out, recv_bytes, opts);
  }
  void send(const void* data, size_t bytes, int peer, uint32_t tag,
            const comm::op_options& opts) override {
    ++others;
    inner_.send(data, bytes, peer, tag, opts);
  }
  void recv(void* data, size_t bytes, int peer, uint32_t tag,
            const comm::op_options& opts) override {
    ++others;
    inner_.recv(data, bytes, peer, tag, opts);
  }
  void abort() override { inner_.abort(); }
  bool aborted() const override { return inner_.aborted(); }

  int all_reduces = 0;
  size_t floats = 0;
  int others = 0;  ///< any other collective: tp_gpt must issue none

 private:
  comm::communicator& inner_;
};

/// A communicator with an identity and no peers, for checks that never communicate.
class unconnected_communicator final : public comm::communicator {
 public:
  explicit unconnected_communicator(int size, int rank = 0) : id_{0, "tp", rank, size} {}
  const comm::comm_identity& identity() const override { return id_; }
  void all_reduce(float*, size_t, comm::reduce_op, const comm::op_options&) override { fail(); }
  void broadcast(void*, size_t, int, const comm::op_options&) override { fail(); }
  void barrier(const comm::op_options&) override { fail(); }
  void reduce_scatter(const float*, float*, size_t, comm::reduce_op,
                      const comm::op_options&) override {
    fail();
  }
  void all_gather(const void*, void*, size_t, const comm::op_options&) override { fail(); }
  void all_to_all(const void*, void*, size_t, const comm::op_options&) override { fail(); }
  void all_to_allv(const void*, const std::vector<size_t>&, void*, const std::vector<size_t>&,
                   const comm::op_options&) override {
    fail();
  }
  void send(const void*, size_t, int, uint32_t, const comm::op_options&) override { fail(); }
  void recv(void*, size_t, int, uint32_t, const comm::op_options&) override { fail(); }
  void abort() override {}
  bool aborted() const override { return false; }

 private:
  [[noreturn]] static void fail() {
    throw comm::comm_error(comm::comm_errc::invalid, "unconnected_communicator");
  }
  comm::comm_identity id_;
};

/// Runs body(rank, tp communicator, dp communicator) on dp * tp threads. Rank g = d * tp + r
/// is tp rank r of tp group "tp<d>" and dp rank d of dp group "dp<r>".
void on_ranks(int dp, int tp,
              const std::function<void(int, counting_communicator&, comm::communicator&)>& body) {
  comm::tcp_store_server server;
  std::vector<std::future<void>> ranks;
  ranks.reserve(static_cast<size_t>(dp * tp));
  for (int g = 0; g < dp * tp; ++g) {
    ranks.push_back(std::async(std::launch::async, [&, g] {
      const int d = g / tp;
      const int r = g % tp;
      auto store = comm::connect_tcp_store("127.0.0.1", server.port(), 10s);
      auto tp_comm = comm::make_gloo_communicator(*store, {1, "tp" + std::to_string(d), r, tp});
      auto dp_comm = comm::make_gloo_communicator(*store, {1, "dp" + std::to_string(r), d, dp});
      counting_communicator counted(*tp_comm);
      body(g, counted, *dp_comm);
    }));
  }
  for (auto& f : ranks) f.get();  // rethrows a rank's failure
}

using test::batch;
using test::small_config;

/// How far `got` is from `want` over one tensor: the largest element error relative to
/// |want| among elements with |want| >= floor, the largest absolute error, and the error of
/// the whole tensor relative to its L2 norm.
struct difference {
  double max_rel = 0;
  double max_abs = 0;
  double norm_rel = 0;
};

difference compare(const float* got, const float* want, size_t n, double floor) {
  difference d;
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double w = want[i];
    const double e = std::abs(static_cast<double>(got[i]) - w);
    if (std::abs(w) >= floor) d.max_rel = std::max(d.max_rel, e / std::abs(w));
    d.max_abs = std::max(d.max_abs, e);
    err2 += e * e;
    ref2 += w * w;
  }
  d.norm_rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  return d;
}

// One forward/backward on tp = 2 and 4: the sliced init is exact, the loss matches the
// single-rank model to 1e-5 relative, every gathered gradient element to 1e-4 relative
// (absolute 1e-6 for tiny values), the clipping norm to 1e-5; replicated gradients are
// bitwise identical on every rank; and the all-reduces are exactly the documented ones.
TEST(tensor_parallel, forward_backward_matches_single_rank_gpt) {
  set_blas_threads(1);
  const model_config cfg = small_config();
  const batch b(3, 12, 5);  // T < context: unused position rows must stay exactly zero
  gpt ref(cfg);
  ref.init_params(42);
  const std::vector<float> init(ref.params(), ref.params() + ref.num_params());
  test::perturb(ref.params(), ref.num_params());
  ref.zero_grads();
  const double ref_loss = ref.forward_loss(b.inputs.data(), b.targets.data(), b.B, b.T);
  EXPECT_EQ(ref.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, 0.75f), ref_loss);
  const double ref_norm = adamw::grad_norm(ref.grads(), ref.num_params());

  for (const int t : {2, 4}) {
    SCOPED_TRACE("tp = " + std::to_string(t));
    std::mutex mu;
    std::vector<std::vector<float>> replicated(t);
    on_ranks(1, t, [&](int r, counting_communicator& c, comm::communicator&) {
      tp_gpt m(cfg, c);
      m.init_params(42);
      std::vector<float> full(m.full_num_params());
      m.gather_full_params(full.data());
      const int gathers = c.all_reduces;
      EXPECT_EQ(0, std::memcmp(full.data(), init.data(), full.size() * sizeof(float)))
          << "init is not an exact slice of gpt::init_params";
      m.load_from_full(ref.params());  // the perturbed model, read only by every rank

      m.zero_grads();
      const double loss_only = m.forward_loss(b.inputs.data(), b.targets.data(), b.B, b.T);
      const int forward_calls = c.all_reduces - gathers;
      const double loss = m.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, 0.75f);
      const int pass_calls = c.all_reduces - gathers - forward_calls;
      const double norm = m.global_grad_norm();
      m.gather_full_grads(full.data());

      std::lock_guard<std::mutex> lock(mu);
      // The documented counts: forward 2L + 3 = 7 (embedding, 2 row-parallel per block,
      // cross-entropy max and sum-exp), backward 2L + 1 = 5 (2 column-parallel inputs per
      // block, the head's input); no other collective.
      EXPECT_EQ(forward_calls, 7);
      EXPECT_EQ(forward_calls, tp_gpt::all_reduces_per_forward(cfg.n_layer));
      EXPECT_EQ(pass_calls, 7 + 5);
      EXPECT_EQ(pass_calls - forward_calls, tp_gpt::all_reduces_per_backward(cfg.n_layer));
      EXPECT_EQ(c.others, 0);
      EXPECT_EQ(loss, loss_only);
      EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss) << "rank " << r;
      EXPECT_NEAR(norm, ref_norm, 1e-5 * ref_norm) << "rank " << r;
      difference worst;
      for (const param_tensor& p : ref.param_table()) {
        const difference d = compare(full.data() + p.offset, ref.grads() + p.offset, p.numel, 1e-3);
        // Element criterion: |got - want| <= 1e-4 |want| or <= 1e-6.
        for (size_t i = 0; i < p.numel; ++i) {
          const double want = ref.grads()[p.offset + i];
          const double e = std::abs(full[p.offset + i] - want);
          ASSERT_TRUE(e <= 1e-4 * std::abs(want) || e <= 1e-6)
              << p.name << "[" << i << "] got " << full[p.offset + i] << " want " << want;
        }
        worst.max_rel = std::max(worst.max_rel, d.max_rel);
        worst.max_abs = std::max(worst.max_abs, d.max_abs);
        worst.norm_rel = std::max(worst.norm_rel, d.norm_rel);
      }
      if (r == 0) {
        std::printf(
            "tp=%d: loss rel %.2e, clip norm rel %.2e; gradients: worst element rel %.2e "
            "(|g| >= 1e-3), worst abs %.2e, worst tensor L2 rel %.2e\n",
            t, std::abs(loss - ref_loss) / ref_loss, std::abs(norm - ref_norm) / ref_norm,
            worst.max_rel, worst.max_abs, worst.norm_rel);
      }
      for (const shard_tensor& s : m.shard_table()) {
        if (!s.replicated) continue;
        replicated[r].insert(replicated[r].end(), m.grads() + s.local.offset,
                             m.grads() + s.local.offset + s.local.numel);
      }
    });
    for (int r = 1; r < t; ++r) {
      ASSERT_EQ(replicated[r].size(), replicated[0].size());
      EXPECT_EQ(0, std::memcmp(replicated[r].data(), replicated[0].data(),
                               replicated[0].size() * sizeof(float)))
          << "replicated gradients differ between tp ranks 0 and " << r;
    }
  }
}

/// A deterministic corpus with enough structure for the loss to fall.
token_dataset synthetic_corpus() {
  const std::string words[] = {"the ",  "quick ", "brown ", "fox ",  "jumps ",  "over ",
                               "lazy ", "dog ",   "and ",   "then ", "sleeps. "};
  std::vector<uint8_t> bytes;
  uint64_t h = 12345;
  while (bytes.size() < 20000) {
    h = h * 6364136223846793005ULL + 1442695040888963407ULL;
    for (char ch : words[(h >> 33) % 11]) bytes.push_back(static_cast<uint8_t>(ch));
  }
  return token_dataset::from_bytes(std::move(bytes), 0.1);
}

train_config training_config() {
  train_config c;
  c.model = small_config();
  c.batch = 8;
  c.micro_batch = 2;  // several micro-batches per rank: accumulation is exercised
  c.seed = 7;
  c.optim.lr = 1e-2;
  c.optim.warmup_steps = 3;
  c.optim.grad_clip = 0.5;  // low enough that clipping acts on several steps
  return c;
}

// 20 steps of AdamW with clipping, single rank against dp x tp = 1 x 4 and 2 x 2 (the dp
// reduction is the plain all-reduce sum over the dp group): the same loss every step to 1e-4
// relative and the same final parameters to 1e-4.
TEST(tensor_parallel, training_matches_single_rank_trainer) {
  set_blas_threads(1);
  const int steps = 20;
  const train_config cfg = training_config();
  const token_dataset data = synthetic_corpus();

  gpt ref(cfg.model);
  ref.init_params(cfg.seed);
  adamw ref_opt(cfg.optim, ref.param_table(), ref.num_params());
  std::vector<double> ref_losses;
  int clipped = 0;
  for (int s = 0; s < steps; ++s) {
    const grad_result g = compute_gradients(ref, data, cfg, s, 0, 1);
    ref_losses.push_back(g.loss_sum / static_cast<double>(g.tokens));
    const double norm = ref_opt.clip_gradients(ref.grads(), ref.num_params());
    clipped += norm > cfg.optim.grad_clip ? 1 : 0;
    ref_opt.step(ref.params(), ref.grads(), s, steps);
  }
  EXPECT_LT(ref_losses.back(), ref_losses.front() - 0.5) << "the reference did not learn";
  EXPECT_GT(clipped, 3) << "clipping should act on several steps";

  for (const auto& layout : {std::pair{1, 4}, std::pair{2, 2}}) {
    // Plain copies, not structured bindings: lambdas may not capture those before C++20.
    const int dp = layout.first;
    const int tp = layout.second;
    SCOPED_TRACE("dp = " + std::to_string(dp) + ", tp = " + std::to_string(tp));
    std::vector<float> final_params(ref.num_params());
    on_ranks(dp, tp, [&](int g, counting_communicator& tc, comm::communicator& dc) {
      const int d = g / tp;
      tp_gpt m(cfg.model, tc);
      m.init_params(cfg.seed);
      adamw opt(cfg.optim, m.param_table(), m.num_params());
      double worst = 0;
      for (int s = 0; s < steps; ++s) {
        grad_result r = compute_tp_gradients(m, data, cfg, s, d, dp);
        float sums[2] = {static_cast<float>(r.loss_sum), static_cast<float>(r.tokens)};
        if (dp > 1) {
          dc.all_reduce(m.grads(), m.num_params(), comm::reduce_op::sum, {30s});
          dc.all_reduce(sums, 2, comm::reduce_op::sum, {30s});
        }
        const double loss = sums[0] / sums[1];
        EXPECT_NEAR(loss, ref_losses[s], 1e-4 * ref_losses[s]) << "step " << s << " rank " << g;
        worst = std::max(worst, std::abs(loss - ref_losses[s]) / ref_losses[s]);
        if (std::isfinite(clip_tp_gradients(m, opt))) opt.step(m.params(), m.grads(), s, steps);
      }
      std::vector<float> full(m.full_num_params());
      m.gather_full_params(full.data());
      if (g == 0) {
        std::printf("dp=%d tp=%d: worst step loss rel diff %.2e\n", dp, tp, worst);
        final_params = full;
      }
    });
    double max_abs = 0;
    for (const param_tensor& p : ref.param_table()) {
      for (size_t i = 0; i < p.numel; ++i) {
        const double want = ref.params()[p.offset + i];
        const double e = std::abs(final_params[p.offset + i] - want);
        max_abs = std::max(max_abs, e / std::max(1.0, std::abs(want)));
        ASSERT_LE(e, 1e-4 * std::max(1.0, std::abs(want)))
            << p.name << "[" << i << "] got " << final_params[p.offset + i] << " want " << want;
      }
    }
    std::printf("dp=%d tp=%d: final params max diff %.2e\n", dp, tp, max_abs);
  }
}

// load_from_full is the inverse of gather_full_params, and the shard table tiles the full
// model: every full element is held by exactly one rank, or by all when replicated.
TEST(tensor_parallel, shard_table_tiles_the_full_model) {
  const model_config cfg = small_config();
  const int t = 4;
  gpt ref(cfg);
  std::vector<int> owners(ref.num_params(), 0);
  for (int r = 0; r < t; ++r) {
    unconnected_communicator c(t, r);  // building the table needs no peers
    tp_gpt m(cfg, c);
    size_t local = 0;
    for (const shard_tensor& s : m.shard_table()) {
      local += s.local.numel;
      size_t boxed = 0;
      const int64_t cols = s.full_shape.size() == 1 ? s.full_shape[0] : s.full_shape[1];
      for (const shard_box& b : s.boxes) {
        boxed += static_cast<size_t>(b.rows * b.cols);
        for (int64_t i = 0; i < b.rows; ++i) {
          for (int64_t j = 0; j < b.cols; ++j) {
            owners[s.full_offset + static_cast<size_t>((b.row + i) * cols + b.col + j)] +=
                s.replicated ? 100 : 1;
          }
        }
      }
      EXPECT_EQ(boxed, s.local.numel) << s.local.name;
    }
    EXPECT_EQ(local, m.num_params());
    // Round trip on the local side: load a full buffer of distinct values, check each slice.
    std::vector<float> full(ref.num_params());
    for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
    m.load_from_full(full.data());
    for (const shard_tensor& s : m.shard_table()) {
      if (s.local.name != "h.1.attn.qkv.weight") continue;
      // Local row C/t (the first k row) is full row C + r C/t.
      const size_t C = static_cast<size_t>(cfg.d_model);
      const size_t Cl = C / t;
      EXPECT_EQ(m.params()[s.local.offset + Cl * C],
                full[s.full_offset + (C + static_cast<size_t>(r) * Cl) * C]);
    }
  }
  for (size_t i = 0; i < owners.size(); ++i) {
    ASSERT_TRUE(owners[i] == 1 || owners[i] == 100 * t) << "element " << i << ": " << owners[i];
  }
}

// Shapes that cannot be split t ways are refused with the reason.
TEST(tensor_parallel, bad_configs_throw_clear_errors) {
  auto message = [](const model_config& cfg, int t) -> std::string {
    unconnected_communicator c(t);
    try {
      tp_gpt m(cfg, c);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  model_config heads = small_config();  // 4 heads over 3 ranks
  EXPECT_NE(message(heads, 3).find("n_head (4) must be divisible by the tp size"),
            std::string::npos)
      << message(heads, 3);
  model_config vocab = small_config();
  vocab.vocab = 258;  // 4 heads split 2 ways, but 258 rows do not split 4 ways
  EXPECT_NE(message(vocab, 4).find("vocab (258) must be divisible"), std::string::npos)
      << message(vocab, 4);
  model_config moe = small_config();
  moe.experts = 4;
  EXPECT_NE(message(moe, 2).find("mixture-of-experts"), std::string::npos) << message(moe, 2);
  model_config broken = small_config();
  broken.d_model = 30;  // gpt's own check: heads must divide d_model
  EXPECT_NE(message(broken, 2).find("n_head (4) must divide d_model"), std::string::npos)
      << message(broken, 2);

  // A shard may move to another communicator only for the same rank and size.
  unconnected_communicator two(2, 1), four(4, 1), other_two(2, 1), rank0(2, 0);
  tp_gpt m(small_config(), two);
  EXPECT_NO_THROW(m.set_tp_comm(other_two));
  EXPECT_EQ(&m.tp_comm(), &other_two);
  EXPECT_THROW(m.set_tp_comm(four), std::invalid_argument);
  EXPECT_THROW(m.set_tp_comm(rank0), std::invalid_argument);
}

// A group of one issues no collective and matches the single-rank model.
TEST(tensor_parallel, group_of_one_needs_no_communication) {
  const model_config cfg = small_config();
  const batch b(2, 16, 9);
  gpt ref(cfg);
  ref.init_params(3);
  ref.zero_grads();
  const double want = ref.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, 1.0f);
  unconnected_communicator c(1);  // throws on any collective
  tp_gpt m(cfg, c);
  m.init_params(3);
  m.zero_grads();
  const double got = m.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, 1.0f);
  EXPECT_NEAR(got, want, 1e-6 * want);
  ASSERT_EQ(m.num_params(), ref.num_params());
  const difference d = compare(m.grads(), ref.grads(), ref.num_params(), 1e-2);
  EXPECT_LT(d.norm_rel, 1e-5);
}

}  // namespace
}  // namespace troupe::tensor_parallel
