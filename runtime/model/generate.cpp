#include "runtime/model/generate.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include "runtime/data/random.hpp"
#include "runtime/model/layers.hpp"

namespace troupe {
namespace {

// One new row is a matrix-vector product; BLAS's gemv does it without the packing a gemm
// with one row pays for (most of a decoding step's time at the sizes troupe trains).
void gemv(int OC, int C, const float* weight, const float* x, float* y) {
  cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, C, 1.0f, weight, C, x, 1, 1.0f, y, 1);
}
void gemv(int OC, int C, const double* weight, const double* x, double* y) {
  cblas_dgemv(CblasRowMajor, CblasNoTrans, OC, C, 1.0, weight, C, x, 1, 1.0, y, 1);
}

/// layers::linear_forward (out[N,OC] = inp[N,C] weight[OC,C]^T + bias), through gemv for one row.
template <typename F>
void linear(F* out, const F* inp, const F* weight, const F* bias, int N, int C, int OC) {
  if (N != 1) {
    layers::linear_forward(out, inp, weight, bias, N, C, OC);
    return;
  }
  if (bias != nullptr) {
    std::memcpy(out, bias, sizeof(F) * static_cast<size_t>(OC));
  } else {
    std::fill(out, out + OC, F(0));
  }
  gemv(OC, C, weight, inp, out);
}

// Mixes the draw's coordinates apart from every other use of the seed (initialisation, data).
constexpr uint64_t sample_stream = 0x73616d706c65ULL;  // "sample"

}  // namespace

// ---------------------------------------------------------------- kv_decoder

template <typename F>
kv_decoder<F>::kv_decoder(const basic_gpt<F>& model) : cfg_(model.config()) {
  const F* p = model.params();
  const auto at = [&](const std::string& name) { return p + model.tensor(name).offset; };
  wte_ = at("wte.weight");
  wpe_ = at("wpe.weight");
  lnf_w_ = at("ln_f.weight");
  lnf_b_ = at("ln_f.bias");
  const bool moe = cfg_.experts > 0;
  if (moe) {
    // cap = ceil(E * tokens * top_k / E) = tokens * top_k: no expert's queue, which holds each
    // token at most once, can overflow.
    const moe::moe_config mc{cfg_.d_model, cfg_.experts, cfg_.top_k,
                             static_cast<double>(cfg_.experts)};
    for (int l = 0; l < cfg_.n_layer; ++l) moe_.emplace_back(mc, nullptr);
  }
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const std::string b = "h." + std::to_string(l) + ".";
    block_weights w{};
    w.ln1_w = at(b + "ln_1.weight");
    w.ln1_b = at(b + "ln_1.bias");
    w.qkv_w = at(b + "attn.qkv.weight");
    w.qkv_b = at(b + "attn.qkv.bias");
    w.proj_w = at(b + "attn.proj.weight");
    w.proj_b = at(b + "attn.proj.bias");
    w.ln2_w = at(b + "ln_2.weight");
    w.ln2_b = at(b + "ln_2.bias");
    if (moe) {
      // Every expert, contiguous after the router (gpt.hpp's layout for a model alone).
      for (int e = 0; e < cfg_.experts; ++e) {
        const std::string name = b + "moe.experts." + std::to_string(e) + ".fc.weight";
        try {
          (void)model.tensor(name);
        } catch (const std::out_of_range&) {
          throw std::invalid_argument(
              "kv_decoder: the model lacks expert " + std::to_string(e) +
              " (one rank of an expert-parallel group); inference needs every expert");
        }
      }
      w.router_w = at(b + "moe.router.weight");
      w.experts = at(b + "moe.experts.0.fc.weight");
    } else {
      w.fc_w = at(b + "mlp.fc.weight");
      w.fc_b = at(b + "mlp.fc.bias");
      w.fcproj_w = at(b + "mlp.proj.weight");
      w.fcproj_b = at(b + "mlp.proj.bias");
    }
    blocks_.push_back(w);
  }
  const size_t T = static_cast<size_t>(cfg_.context);
  const size_t C = static_cast<size_t>(cfg_.d_model);
  k_cache_.assign(static_cast<size_t>(cfg_.n_layer) * T * C, F(0));
  v_cache_.assign(k_cache_.size(), F(0));
  x_.assign(T * C, F(0));
  ln_.assign(T * C, F(0));
  mean_.assign(T, F(0));
  rstd_.assign(T, F(0));
  qkv_.assign(T * 3 * C, F(0));
  atty_.assign(T * C, F(0));
  proj_.assign(T * C, F(0));
  if (!moe) {
    fch_.assign(T * 4 * C, F(0));
    fch_gelu_.assign(T * 4 * C, F(0));
  }
  scratch_.assign(T * T, F(0));
  logits_.assign(static_cast<size_t>(cfg_.vocab), F(0));
}

template <typename F>
const F* kv_decoder<F>::append(std::span<const token_id> tokens, F* all) {
  using namespace layers;
  const int n = static_cast<int>(tokens.size());
  if (tokens.empty()) throw std::invalid_argument("kv_decoder: append needs at least one token");
  if (tokens.size() > static_cast<size_t>(cfg_.context - length_))
    throw std::invalid_argument("kv_decoder: " + std::to_string(tokens.size()) +
                                " tokens do not fit the cache (" + std::to_string(length_) +
                                " of context " + std::to_string(cfg_.context) + " used)");
  for (const token_id t : tokens)
    if (t >= static_cast<token_id>(cfg_.vocab))
      throw std::invalid_argument("kv_decoder: token " + std::to_string(t) +
                                  " is not below the vocabulary (" + std::to_string(cfg_.vocab) +
                                  ")");
  const int C = cfg_.d_model;
  const int C3 = 3 * C;
  const int NH = cfg_.n_head;
  const int V = cfg_.vocab;
  const int p0 = length_;
  const size_t nC = static_cast<size_t>(n) * C;
  const size_t layer_cache = static_cast<size_t>(cfg_.context) * C;
  F* x = x_.data();

  embedding_forward(x, tokens.data(), wte_, wpe_ + static_cast<size_t>(p0) * C, 1, n, C);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const block_weights& w = blocks_[static_cast<size_t>(l)];
    F* kc = k_cache_.data() + layer_cache * l;
    F* vc = v_cache_.data() + layer_cache * l;
    layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x, w.ln1_w, w.ln1_b, n, C);
    linear(qkv_.data(), ln_.data(), w.qkv_w, w.qkv_b, n, C, C3);
    for (int i = 0; i < n; ++i) {
      const F* row = qkv_.data() + static_cast<size_t>(i) * C3;
      const size_t at = static_cast<size_t>(p0 + i) * C;
      std::memcpy(kc + at, row + C, sizeof(F) * C);
      std::memcpy(vc + at, row + 2 * C, sizeof(F) * C);
    }
    attention_forward_cached(atty_.data(), scratch_.data(), qkv_.data(), C3, kc, vc, C, n, p0, C,
                             NH);
    linear(proj_.data(), atty_.data(), w.proj_w, w.proj_b, n, C, C);
    residual_forward(x, x, proj_.data(), nC);
    layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x, w.ln2_w, w.ln2_b, n, C);
    if (!moe_.empty()) {
      (void)moe_[static_cast<size_t>(l)].forward(proj_.data(), ln_.data(), n, w.router_w,
                                                 w.experts);
    } else {
      linear(fch_.data(), ln_.data(), w.fc_w, w.fc_b, n, C, 4 * C);
      gelu_forward(fch_gelu_.data(), fch_.data(), nC * 4);
      linear(proj_.data(), fch_gelu_.data(), w.fcproj_w, w.fcproj_b, n, 4 * C, C);
    }
    residual_forward(x, x, proj_.data(), nC);
  }
  length_ += n;
  // The head (tied to wte) only for the rows asked for: the last, or every one.
  const int rows = all != nullptr ? n : 1;
  const F* last = x + static_cast<size_t>(n - rows) * C;
  layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), last, lnf_w_, lnf_b_, rows, C);
  F* out = all != nullptr ? all : logits_.data();
  linear(out, ln_.data(), wte_, static_cast<const F*>(nullptr), rows, C, V);
  return out + static_cast<size_t>(rows - 1) * V;
}

template class kv_decoder<float>;
template class kv_decoder<double>;

// ---------------------------------------------------------------- sampling

token_sampler::token_sampler(const sampling_options& o) : o_(o) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    throw std::invalid_argument("temperature must be a finite number >= 0, got " +
                                std::to_string(o.temperature));
  if (o.top_k < 0)
    throw std::invalid_argument("top_k must be >= 0 (0 = no limit), got " +
                                std::to_string(o.top_k));
  if (o.allowed < 0)
    throw std::invalid_argument("allowed must be >= 0, got " + std::to_string(o.allowed));
}

template <typename F>
token_id token_sampler::next(const F* logits, int V) {
  const int n = o_.allowed > 0 ? static_cast<int>(std::min<int64_t>(V, o_.allowed)) : V;
  const uint64_t draw = draws_++;
  if (o_.temperature == 0 || o_.top_k == 1) {
    int best = 0;
    for (int i = 1; i < n; ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<token_id>(best);
  }
  z_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) z_[i] = static_cast<double>(logits[i]) / o_.temperature;
  double floor = -HUGE_VAL;
  if (o_.top_k > 0 && o_.top_k < n) {
    sorted_ = z_;
    const auto kth = sorted_.begin() + (o_.top_k - 1);
    std::nth_element(sorted_.begin(), kth, sorted_.end(), std::greater<>());
    floor = *kth;
  }
  double top = -HUGE_VAL;
  for (const double z : z_)
    if (z >= floor) top = std::max(top, z);
  double total = 0;
  int last_kept = 0;
  for (int i = 0; i < n; ++i) {
    const double w = z_[i] >= floor ? std::exp(z_[i] - top) : 0.0;
    z_[i] = w;
    total += w;
    if (w > 0) last_kept = i;
  }
  const double u = to_unit(hash_words(o_.seed, draw, sample_stream)) * total;
  double acc = 0;
  for (int i = 0; i < n; ++i) {
    acc += z_[i];
    if (u < acc) return static_cast<token_id>(i);
  }
  return static_cast<token_id>(last_kept);  // u within rounding of the total
}

template token_id token_sampler::next<float>(const float*, int);
template token_id token_sampler::next<double>(const double*, int);

// ---------------------------------------------------------------- generate

template <typename F>
std::vector<token_id> generate(kv_decoder<F>& decoder, std::span<const token_id> prompt,
                               int64_t count, token_sampler& sampler,
                               const std::function<void(token_id)>& emit) {
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt needs at least one token");
  if (count < 0)
    throw std::invalid_argument("generate: count must be >= 0, got " + std::to_string(count));
  const size_t T = static_cast<size_t>(decoder.context());
  std::vector<token_id> out;
  out.reserve(static_cast<size_t>(count));
  // The last T tokens of the sequence so far: all that the next token's logits depend on.
  std::vector<token_id> window(
      prompt.end() - static_cast<std::ptrdiff_t>(std::min(T, prompt.size())), prompt.end());
  decoder.clear();
  const F* logits = decoder.append(window);
  for (int64_t i = 0; i < count; ++i) {
    const token_id t = sampler.next(logits, decoder.vocab());
    out.push_back(t);
    if (emit) emit(t);
    if (i + 1 == count) break;  // the logits after the last token are never used
    if (static_cast<size_t>(decoder.length()) < T) {
      window.push_back(t);
      logits = decoder.append(std::span<const token_id>(&t, 1));
      continue;
    }
    // Past the context: crop to the last T tokens; every position moved, so the cache is
    // recomputed for the new window in one pass.
    window.erase(window.begin());
    window.push_back(t);
    decoder.clear();
    logits = decoder.append(window);
  }
  return out;
}

template std::vector<token_id> generate<float>(kv_decoder<float>&, std::span<const token_id>,
                                               int64_t, token_sampler&,
                                               const std::function<void(token_id)>&);
template std::vector<token_id> generate<double>(kv_decoder<double>&, std::span<const token_id>,
                                                int64_t, token_sampler&,
                                                const std::function<void(token_id)>&);

}  // namespace troupe
