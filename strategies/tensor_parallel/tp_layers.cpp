#include "strategies/tensor_parallel/tp_layers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/model/layers.hpp"

namespace troupe::tensor_parallel {

rank_order_tree::rank_order_tree(int ranks) : pieces(static_cast<size_t>(ranks)) {
  for (int r = 0; r < ranks; ++r) pieces[static_cast<size_t>(r)] = {comm::tree_node{r, 1}};
}

void tp_sum(const tp_group& g, float* x, size_t n) {
  // A group of one has nothing to add; skipping keeps t = 1 free of any communicator cost.
  if (g.size() <= 1) return;
  if (!g.rank_order) return g.comm->all_reduce(x, n, comm::reduce_op::sum, g.opts);
  // The leaf is copied out first: the sum is written while the pieces are read, and into x.
  rank_order_tree& tree = *g.rank_order;
  tree.leaf.assign(x, x + n);
  const float* const mine[] = {tree.leaf.data()};
  comm::tree_sum_parts parts;
  parts.M = g.size();
  parts.pieces = &g.rank_order->pieces;
  parts.values = mine;
  parts.buffers = &g.rank_order->buffers;
  g.comm->all_reduce_tree(parts, 0, n, x, g.opts);
}

void reduce_from_tensor_parallel_region(const tp_group& g, float* x, size_t n) { tp_sum(g, x, n); }

void copy_to_tensor_parallel_region_backward(const tp_group& g, float* dx, size_t n) {
  tp_sum(g, dx, n);
}

void column_parallel_linear_forward(float* out_l, const float* inp, const float* weight_l,
                                    const float* bias_l, int N, int C, int OC_l) {
  layers::linear_forward(out_l, inp, weight_l, bias_l, N, C, OC_l);
}

void column_parallel_linear_backward(const tp_group& g, float* dinp, float* dweight_l,
                                     float* dbias_l, const float* dout_l, const float* inp,
                                     const float* weight_l, int N, int C, int OC_l) {
  const size_t NC = static_cast<size_t>(N) * C;
  std::fill(dinp, dinp + NC, 0.0f);
  layers::linear_backward(dinp, dweight_l, dbias_l, dout_l, inp, weight_l, N, C, OC_l);
  copy_to_tensor_parallel_region_backward(g, dinp, NC);
}

void row_parallel_linear_forward(const tp_group& g, float* out, const float* inp_l,
                                 const float* weight_l, const float* bias, int N, int C_l, int OC) {
  layers::linear_forward(out, inp_l, weight_l, static_cast<const float*>(nullptr), N, C_l, OC);
  reduce_from_tensor_parallel_region(g, out, static_cast<size_t>(N) * OC);
  if (bias == nullptr) return;
  for (int n = 0; n < N; ++n) {
    float* o = out + static_cast<size_t>(n) * OC;
    for (int c = 0; c < OC; ++c) o[c] += bias[c];
  }
}

void row_parallel_linear_backward(float* dinp_l, float* dweight_l, float* dbias, const float* dout,
                                  const float* inp_l, const float* weight_l, int N, int C_l,
                                  int OC) {
  layers::linear_backward(dinp_l, dweight_l, dbias, dout, inp_l, weight_l, N, C_l, OC);
}

void vocab_parallel_embedding_forward(const tp_group& g, float* out, const token_id* inputs,
                                      const float* wte_l, int vocab_start, int V_l,
                                      const float* wpe, int B, int T, int C) {
  const size_t NC = static_cast<size_t>(B) * T * C;
  std::fill(out, out + NC, 0.0f);
  for (int i = 0; i < B * T; ++i) {
    const int row = static_cast<int>(inputs[i]) - vocab_start;
    if (row < 0 || row >= V_l) continue;  // another rank owns this token's row
    std::memcpy(out + static_cast<size_t>(i) * C, wte_l + static_cast<size_t>(row) * C,
                sizeof(float) * C);
  }
  // Exactly one rank contributes each row and the others add zeros, so the sum is exact.
  reduce_from_tensor_parallel_region(g, out, NC);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<size_t>(b) * T + t) * C;
      const float* p = wpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] += p[c];
    }
  }
}

void vocab_parallel_embedding_backward(float* dwte_l, float* dwpe, const float* dout,
                                       const token_id* inputs, int vocab_start, int V_l, int B,
                                       int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(b) * T + t;
      const float* d = dout + i * C;
      float* dp = dwpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) dp[c] += d[c];
      const int row = static_cast<int>(inputs[i]) - vocab_start;
      if (row < 0 || row >= V_l) continue;
      float* de = dwte_l + static_cast<size_t>(row) * C;
      for (int c = 0; c < C; ++c) de[c] += d[c];
    }
  }
}

double vocab_parallel_cross_entropy_forward(const tp_group& g, float* probs_l,
                                            const float* logits_l, const token_id* targets, int N,
                                            int vocab_start, int V_l, float* work) {
  const int t = g.size();
  const size_t Nz = static_cast<size_t>(N);
  float* maxima = work;             // [t,N]: row r holds rank r's row maxima
  float* row_max = work + Nz * t;   // [N] the maximum over the whole vocabulary
  float* sums = row_max + Nz;       // [N] sum of exp(logit - row_max)
  float* target_logit = sums + Nz;  // [N]

  // The communicator reduces by sum only; an all-gather built from it (each rank fills its
  // own row, zeros elsewhere) gives every rank all t maxima, of which it takes the largest.
  std::fill(maxima, maxima + Nz * t, 0.0f);
  float* mine = maxima + Nz * g.rank();
  for (int n = 0; n < N; ++n) {
    const float* l = logits_l + static_cast<size_t>(n) * V_l;
    mine[n] = *std::max_element(l, l + V_l);
  }
  reduce_from_tensor_parallel_region(g, maxima, Nz * t);
  for (int n = 0; n < N; ++n) {
    float m = maxima[n];
    for (int r = 1; r < t; ++r) m = std::max(m, maxima[static_cast<size_t>(r) * Nz + n]);
    row_max[n] = m;
  }

  // Read the target logits before probs_l (which may alias logits_l) is written.
  for (int n = 0; n < N; ++n) {
    const int col = static_cast<int>(targets[n]) - vocab_start;
    target_logit[n] = (col >= 0 && col < V_l) ? logits_l[static_cast<size_t>(n) * V_l + col] : 0.0f;
    const float* l = logits_l + static_cast<size_t>(n) * V_l;
    float* p = probs_l + static_cast<size_t>(n) * V_l;
    float s = 0;
    for (int v = 0; v < V_l; ++v) {
      p[v] = std::exp(l[v] - row_max[n]);
      s += p[v];
    }
    sums[n] = s;
  }
  // sums and target_logit are adjacent: one all-reduce carries both.
  reduce_from_tensor_parallel_region(g, sums, 2 * Nz);

  double loss = 0;
  for (int n = 0; n < N; ++n) {
    // -log softmax = log(sum) + max - logit, as in the single-rank layer.
    loss += static_cast<double>(std::log(sums[n]) + row_max[n] - target_logit[n]);
    const float inv = 1.0f / sums[n];
    float* p = probs_l + static_cast<size_t>(n) * V_l;
    for (int v = 0; v < V_l; ++v) p[v] *= inv;
  }
  return loss;
}

void vocab_parallel_cross_entropy_backward(float* dlogits_l, const float* probs_l,
                                           const token_id* targets, float dloss, int N,
                                           int vocab_start, int V_l) {
  for (int n = 0; n < N; ++n) {
    const float* p = probs_l + static_cast<size_t>(n) * V_l;
    float* d = dlogits_l + static_cast<size_t>(n) * V_l;
    for (int v = 0; v < V_l; ++v) d[v] += dloss * p[v];
    const int col = static_cast<int>(targets[n]) - vocab_start;
    if (col >= 0 && col < V_l) d[col] -= dloss;
  }
}

}  // namespace troupe::tensor_parallel
