#include "runtime/model/moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "runtime/model/layers.hpp"

namespace troupe::moe {
namespace {

template <typename T>
void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

/// Views of one expert's four tensors inside a flat buffer of experts.
template <typename F>
struct expert_view {
  F *fc_w, *fc_b, *proj_w, *proj_b;
  expert_view(F* base, int C, int index) {
    const size_t c = static_cast<size_t>(C);
    fc_w = base + static_cast<size_t>(index) * expert_param_count(C);
    fc_b = fc_w + 4 * c * c;
    proj_w = fc_b + 4 * c;
    proj_b = proj_w + 4 * c * c;
  }
};

}  // namespace

void local_exchange::all_gather(const void* in, void* out, size_t bytes) {
  if (bytes > 0) std::memcpy(out, in, bytes);
}

void local_exchange::all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                                 const std::vector<size_t>& recv_bytes) {
  if (send_bytes.size() != 1 || recv_bytes.size() != 1 || send_bytes[0] != recv_bytes[0]) {
    throw std::invalid_argument("moe local_exchange: a group of one sends itself what it receives");
  }
  if (send_bytes[0] > 0) std::memcpy(out, in, send_bytes[0]);
}

template <typename F>
moe_layer<F>::moe_layer(const moe_config& cfg, expert_exchange* exchange)
    : cfg_(cfg), exchange_(exchange) {
  auto fail = [](const std::string& why) { throw std::invalid_argument("moe: " + why); };
  if (cfg.C < 1 || cfg.E < 1) fail("C and E must be positive");
  if (cfg.top_k != 1 && cfg.top_k != 2) fail("top_k must be 1 or 2");
  if (cfg.top_k > cfg.E) fail("top_k must not exceed the number of experts");
  if (!(cfg.capacity_factor > 0)) fail("capacity_factor must be positive");
  const int p = group().size();
  if (p < 1 || cfg.E % p != 0) {
    fail("the expert-parallel group size (" + std::to_string(p) + ") must divide E (" +
         std::to_string(cfg.E) + ")");
  }
  local_experts_ = cfg.E / p;
  first_expert_ = group().rank() * local_experts_;
  routed_.assign(static_cast<size_t>(cfg.E), 0);
  top1_frac_.assign(static_cast<size_t>(cfg.E), 0.0);
}

template <typename F>
std::vector<bool> moe_layer<F>::kept() const {
  std::vector<bool> k(static_cast<size_t>(N_) * cfg_.top_k);
  for (size_t i = 0; i < k.size(); ++i) k[i] = slot_row_[i] >= 0;
  return k;
}

/// Router probabilities, the top_k choices and their gates for this rank's tokens.
template <typename F>
void moe_layer<F>::route(const F* inp, int N, const F* router_w) {
  const int C = cfg_.C, E = cfg_.E, K = cfg_.top_k;
  grow(probs_, static_cast<size_t>(N) * E);
  grow(choice_, static_cast<size_t>(N) * K);
  grow(gate_, static_cast<size_t>(N) * K);
  layers::linear_forward(probs_.data(), inp, router_w, static_cast<const F*>(nullptr), N, C, E);
  for (int t = 0; t < N; ++t) {
    F* p = probs_.data() + static_cast<size_t>(t) * E;
    F mx = p[0];
    for (int e = 1; e < E; ++e) mx = std::max(mx, p[e]);
    F sum = 0;
    for (int e = 0; e < E; ++e) {
      p[e] = std::exp(p[e] - mx);
      sum += p[e];
    }
    for (int e = 0; e < E; ++e) p[e] /= sum;
    // Strict comparisons in ascending order: ties go to the lower expert index.
    int first = 0;
    for (int e = 1; e < E; ++e) {
      if (p[e] > p[first]) first = e;
    }
    int* ch = choice_.data() + static_cast<size_t>(t) * K;
    F* g = gate_.data() + static_cast<size_t>(t) * K;
    ch[0] = first;
    if (K == 1) {
      g[0] = p[first];
      continue;
    }
    int second = first == 0 ? 1 : 0;
    for (int e = 0; e < E; ++e) {
      if (e != first && p[e] > p[second]) second = e;
    }
    ch[1] = second;
    const F s = p[first] + p[second];
    g[0] = p[first] / s;
    g[1] = p[second] / s;
  }
}

/// Exchanges routing statistics over the group and derives from them, identically on
/// every rank, the capacity, what every rank sends every expert, and the row layouts.
template <typename F>
void moe_layer<F>::plan(int N) {
  const int E = cfg_.E, K = cfg_.top_k;
  const int P = group().size(), me = group().rank();
  const size_t width = 1 + 3 * static_cast<size_t>(E);  // N, routed[E], top1[E], psum[E]
  stats_.assign(width, 0.0);
  stats_[0] = N;
  for (int t = 0; t < N; ++t) {
    for (int j = 0; j < K; ++j) stats_[1 + choice_[static_cast<size_t>(t) * K + j]] += 1;
    stats_[1 + E + choice_[static_cast<size_t>(t) * K]] += 1;
    const F* p = probs_.data() + static_cast<size_t>(t) * E;
    for (int e = 0; e < E; ++e) stats_[1 + 2 * E + e] += static_cast<double>(p[e]);
  }
  all_stats_.assign(width * P, 0.0);
  group().all_gather(stats_.data(), all_stats_.data(), width * sizeof(double));

  // Sums in rank order, so every rank derives bit-identical values.
  double tokens = 0;
  std::vector<double> top1(E, 0.0), psum(E, 0.0);
  std::fill(routed_.begin(), routed_.end(), 0);
  for (int r = 0; r < P; ++r) {
    const double* s = all_stats_.data() + width * r;
    tokens += s[0];
    for (int e = 0; e < E; ++e) {
      routed_[e] += static_cast<int64_t>(s[1 + e]);
      top1[e] += s[1 + E + e];
      psum[e] += s[1 + 2 * E + e];
    }
  }
  capacity_ = static_cast<int64_t>(std::ceil(cfg_.capacity_factor * tokens * K / E));
  aux_ = 0;
  for (int e = 0; e < E; ++e) {
    top1_frac_[e] = top1[e] / tokens;
    aux_ += top1_frac_[e] * (psum[e] / tokens);
  }
  aux_ *= E;

  // Queues fill in rank order: rank r's choices for e start after those of ranks < r.
  kept_.assign(static_cast<size_t>(P) * E, 0);
  dropped_ = 0;
  for (int e = 0; e < E; ++e) {
    int64_t before = 0;
    for (int r = 0; r < P; ++r) {
      const auto n = static_cast<int64_t>(all_stats_[width * r + 1 + e]);
      const int64_t k = std::clamp<int64_t>(capacity_ - before, 0, n);
      kept_[static_cast<size_t>(r) * E + e] = k;
      dropped_ += n - k;
      before += n;
    }
  }

  // Send rows: experts ascending (so destinations ascending), tokens in order.
  const int64_t* mine = kept_.data() + static_cast<size_t>(me) * E;
  std::vector<int64_t> base(E + 1, 0), used(E, 0), taken(E, 0);
  for (int e = 0; e < E; ++e) base[e + 1] = base[e] + mine[e];
  grow(slot_row_, static_cast<size_t>(N) * K);
  send_slot_.assign(static_cast<size_t>(base[E]), 0);
  for (int t = 0; t < N; ++t) {
    for (int j = 0; j < K; ++j) {
      const size_t slot = static_cast<size_t>(t) * K + j;
      const int e = choice_[slot];
      if (taken[e]++ < mine[e]) {
        const int64_t row = base[e] + used[e]++;
        slot_row_[slot] = static_cast<int>(row);
        send_slot_[row] = static_cast<int>(slot);
      } else {
        slot_row_[slot] = -1;
      }
    }
  }
  const size_t row_bytes = static_cast<size_t>(cfg_.C) * sizeof(F);
  send_bytes_.assign(P, 0);
  recv_bytes_.assign(P, 0);
  for (int e = 0; e < E; ++e) send_bytes_[e / local_experts_] += mine[e] * row_bytes;

  // Received rows arrive as [source][local expert][token]; experts compute on
  // [local expert][source][token], which is the single-rank queue order.
  const int L = local_experts_;
  expert_rows_.assign(L + 1, 0);
  for (int le = 0; le < L; ++le) {
    int64_t n = 0;
    for (int r = 0; r < P; ++r) n += kept_[static_cast<size_t>(r) * E + first_expert_ + le];
    expert_rows_[le + 1] = expert_rows_[le] + static_cast<int>(n);
  }
  recv_perm_.assign(static_cast<size_t>(expert_rows_[L]), 0);
  std::vector<int> fill(L, 0);
  int recv_row = 0;
  for (int r = 0; r < P; ++r) {
    for (int le = 0; le < L; ++le) {
      const int64_t n = kept_[static_cast<size_t>(r) * E + first_expert_ + le];
      recv_bytes_[r] += n * row_bytes;
      for (int64_t i = 0; i < n; ++i) recv_perm_[expert_rows_[le] + fill[le]++] = recv_row++;
    }
  }
}

/// Each local expert on its rows of x_: h_ = fc(x), g_ = gelu(h), ey_ = proj(g).
template <typename F>
void moe_layer<F>::run_experts(const F* experts) {
  const int C = cfg_.C;
  for (int le = 0; le < local_experts_; ++le) {
    const int M = expert_rows_[le + 1] - expert_rows_[le];
    if (M == 0) continue;
    const size_t r0 = expert_rows_[le];
    const expert_view<const F> w(experts, C, le);
    F* h = h_.data() + r0 * 4 * C;
    F* g = g_.data() + r0 * 4 * C;
    layers::linear_forward(h, x_.data() + r0 * C, w.fc_w, w.fc_b, M, C, 4 * C);
    layers::gelu_forward(g, h, static_cast<size_t>(M) * 4 * C);
    layers::linear_forward(ey_.data() + r0 * C, g, w.proj_w, w.proj_b, M, 4 * C, C);
  }
}

template <typename F>
double moe_layer<F>::forward(F* out, const F* inp, int N, const F* router_w, const F* experts) {
  const size_t C = static_cast<size_t>(cfg_.C);
  const int K = cfg_.top_k;
  N_ = N;
  route(inp, N, router_w);
  plan(N);

  const size_t send_rows = send_slot_.size(), recv_rows = recv_perm_.size();
  grow(send_, std::max(send_rows, recv_rows) * C);
  grow(recv_, std::max(send_rows, recv_rows) * C);
  grow(y_, send_rows * C);
  grow(x_, recv_rows * C);
  grow(ey_, recv_rows * C);
  grow(h_, recv_rows * 4 * C);
  grow(g_, recv_rows * 4 * C);

  for (size_t row = 0; row < send_rows; ++row) {
    const size_t t = static_cast<size_t>(send_slot_[row]) / K;
    std::memcpy(send_.data() + row * C, inp + t * C, C * sizeof(F));
  }
  group().all_to_allv(send_.data(), send_bytes_, recv_.data(), recv_bytes_);
  for (size_t row = 0; row < recv_rows; ++row) {
    std::memcpy(x_.data() + row * C, recv_.data() + recv_perm_[row] * C, C * sizeof(F));
  }
  run_experts(experts);
  for (size_t row = 0; row < recv_rows; ++row) {
    std::memcpy(recv_.data() + recv_perm_[row] * C, ey_.data() + row * C, C * sizeof(F));
  }
  group().all_to_allv(recv_.data(), recv_bytes_, y_.data(), send_bytes_);

  // Combine at the origin, choices in rank order (best first).
  std::fill(out, out + static_cast<size_t>(N) * C, F(0));
  for (int t = 0; t < N; ++t) {
    F* o = out + static_cast<size_t>(t) * C;
    for (int j = 0; j < K; ++j) {
      const int row = slot_row_[static_cast<size_t>(t) * K + j];
      if (row < 0) continue;
      const F g = gate_[static_cast<size_t>(t) * K + j];
      const F* y = y_.data() + static_cast<size_t>(row) * C;
      for (size_t c = 0; c < C; ++c) o[c] += g * y[c];
    }
  }
  return aux_;
}

template <typename F>
void moe_layer<F>::backward(F* dinp, F* drouter_w, F* dexperts, const F* dout, const F* inp,
                            const F* router_w, const F* experts, F aux_grad) {
  const int N = N_, E = cfg_.E, K = cfg_.top_k;
  const size_t C = static_cast<size_t>(cfg_.C);
  const size_t send_rows = send_slot_.size(), recv_rows = recv_perm_.size();
  grow(dprobs_, static_cast<size_t>(N) * E);
  std::fill(dprobs_.begin(), dprobs_.begin() + static_cast<size_t>(N) * E, F(0));

  // Gates: d out / d gate_j = y_j, and dy_j = gate_j * dout travels to the expert.
  for (int t = 0; t < N; ++t) {
    const F* d = dout + static_cast<size_t>(t) * C;
    F dgate[2] = {0, 0};
    for (int j = 0; j < K; ++j) {
      const size_t slot = static_cast<size_t>(t) * K + j;
      const int row = slot_row_[slot];
      if (row < 0) continue;
      const F* y = y_.data() + static_cast<size_t>(row) * C;
      F* dy = send_.data() + static_cast<size_t>(row) * C;
      F acc = 0;
      for (size_t c = 0; c < C; ++c) {
        acc += d[c] * y[c];
        dy[c] = gate_[slot] * d[c];
      }
      dgate[j] = acc;
    }
    F* dp = dprobs_.data() + static_cast<size_t>(t) * E;
    const int* ch = choice_.data() + static_cast<size_t>(t) * K;
    if (K == 1) {
      dp[ch[0]] += dgate[0];
    } else {
      // g0 = p0 / (p0 + p1), g1 = p1 / (p0 + p1).
      const F* p = probs_.data() + static_cast<size_t>(t) * E;
      const F p0 = p[ch[0]], p1 = p[ch[1]], s = p0 + p1;
      dp[ch[0]] += p1 * (dgate[0] - dgate[1]) / (s * s);
      dp[ch[1]] += p0 * (dgate[1] - dgate[0]) / (s * s);
    }
    // aux = E sum_e f_e P_e with P_e the mean over this rank's N tokens.
    for (int e = 0; e < E; ++e) {
      dp[e] += aux_grad * static_cast<F>(E * top1_frac_[e] / N);
    }
  }

  group().all_to_allv(send_.data(), send_bytes_, recv_.data(), recv_bytes_);
  grow(dg_, recv_rows * 4 * C);
  grow(dh_, recv_rows * 4 * C);
  grow(dx_, recv_rows * C);
  F* dy = ey_.data();  // the expert outputs are no longer needed: reuse for their gradient
  for (size_t row = 0; row < recv_rows; ++row) {
    std::memcpy(dy + row * C, recv_.data() + recv_perm_[row] * C, C * sizeof(F));
  }
  std::fill(dg_.begin(), dg_.begin() + recv_rows * 4 * C, F(0));
  std::fill(dh_.begin(), dh_.begin() + recv_rows * 4 * C, F(0));
  std::fill(dx_.begin(), dx_.begin() + recv_rows * C, F(0));
  for (int le = 0; le < local_experts_; ++le) {
    const int M = expert_rows_[le + 1] - expert_rows_[le];
    if (M == 0) continue;
    const size_t r0 = expert_rows_[le];
    const expert_view<const F> w(experts, cfg_.C, le);
    const expert_view<F> dw(dexperts, cfg_.C, le);
    const int c = cfg_.C;
    layers::linear_backward(dg_.data() + r0 * 4 * C, dw.proj_w, dw.proj_b, dy + r0 * C,
                            g_.data() + r0 * 4 * C, w.proj_w, M, 4 * c, c);
    layers::gelu_backward(dh_.data() + r0 * 4 * C, h_.data() + r0 * 4 * C, dg_.data() + r0 * 4 * C,
                          static_cast<size_t>(M) * 4 * C);
    layers::linear_backward(dx_.data() + r0 * C, dw.fc_w, dw.fc_b, dh_.data() + r0 * 4 * C,
                            x_.data() + r0 * C, w.fc_w, M, c, 4 * c);
  }
  for (size_t row = 0; row < recv_rows; ++row) {
    std::memcpy(recv_.data() + recv_perm_[row] * C, dx_.data() + row * C, C * sizeof(F));
  }
  group().all_to_allv(recv_.data(), recv_bytes_, send_.data(), send_bytes_);
  for (size_t row = 0; row < send_rows; ++row) {
    const size_t t = static_cast<size_t>(send_slot_[row]) / K;
    F* di = dinp + t * C;
    const F* dx = send_.data() + row * C;
    for (size_t c = 0; c < C; ++c) di[c] += dx[c];
  }

  // Softmax: dlogit_e = p_e (dp_e - sum_e' p_e' dp_e'); then the router's linear map.
  for (int t = 0; t < N; ++t) {
    const F* p = probs_.data() + static_cast<size_t>(t) * E;
    F* dp = dprobs_.data() + static_cast<size_t>(t) * E;
    F dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int e = 0; e < E; ++e) dp[e] = p[e] * (dp[e] - dot);
  }
  layers::linear_backward(dinp, drouter_w, static_cast<F*>(nullptr), dprobs_.data(), inp, router_w,
                          N, cfg_.C, E);
}

template class moe_layer<float>;
template class moe_layer<double>;

}  // namespace troupe::moe
