#include "runtime/model/layers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <type_traits>

#include "runtime/model/blas.hpp"
#include "runtime/model/simd.hpp"

namespace troupe::layers {
namespace {

constexpr double layernorm_eps = 1e-5;
constexpr double gelu_k0 = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double gelu_k1 = 0.044715;

// Row reductions (sums, maxima) are the one kind of loop the compiler may not vectorize by
// itself, since that would reorder the float additions. Eight explicit partial results
// make the order fixed (and deterministic) and let it use one vector register for them.

/// sum of term(i) for i < n.
template <typename F, typename Term>
inline F reduce_sum(int n, Term term) {
  F acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += term(i + k);
  }
  F s = 0;
  for (; i < n; ++i) s += term(i);
  for (int k = 0; k < 8; ++k) s += acc[k];
  return s;
}

/// max of x[i] for i < n (n >= 1).
template <typename F>
inline F reduce_max(const F* x, int n) {
  F acc[8];
  for (int k = 0; k < 8; ++k) acc[k] = x[0];
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] = acc[k] < x[i + k] ? x[i + k] : acc[k];
  }
  F m = x[0];
  for (; i < n; ++i) m = std::max(m, x[i]);
  for (int k = 0; k < 8; ++k) m = std::max(m, acc[k]);
  return m;
}

/// y[i] = exp(x[i] - shift) for i < n; returns the sum of the y[i]. y may alias x.
template <typename F>
inline F exp_shifted(F* y, const F* x, int n, F shift) {
  int i = 0;
  F sum = 0;
#ifdef TROUPE_HAVE_AVX2
  if constexpr (std::is_same_v<F, float>) {
    __m256 acc = _mm256_setzero_ps();
    const __m256 vs = _mm256_set1_ps(shift);
    for (; i + 8 <= n; i += 8) {
      const __m256 e = simd::exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
      _mm256_storeu_ps(y + i, e);
      acc = _mm256_add_ps(acc, e);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    for (float v : lanes) sum += v;
  }
#endif
  for (; i < n; ++i) {
    y[i] = std::exp(x[i] - shift);
    sum += y[i];
  }
  return sum;
}

}  // namespace

// ---------------------------------------------------------------- embedding

template <typename F>
void embedding_forward(F* out, const token_id* inputs, const F* wte, const F* wpe, int B, int T,
                       int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      F* o = out + (static_cast<size_t>(b) * T + t) * C;
      const F* e = wte + static_cast<size_t>(inputs[b * T + t]) * C;
      const F* p = wpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

template <typename F>
void embedding_backward(F* dwte, F* dwpe, const F* dout, const token_id* inputs, int B, int T,
                        int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const F* d = dout + (static_cast<size_t>(b) * T + t) * C;
      F* de = dwte + static_cast<size_t>(inputs[b * T + t]) * C;
      F* dp = dwpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) {
        de[c] += d[c];
        dp[c] += d[c];
      }
    }
  }
}

// ---------------------------------------------------------------- layernorm

template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias,
                       int N, int C) {
  for (int n = 0; n < N; ++n) {
    const F* x = inp + static_cast<size_t>(n) * C;
    F* o = out + static_cast<size_t>(n) * C;
    // Two passes (mean, then centred variance) avoid the cancellation of E[x^2] - E[x]^2.
    const F m = reduce_sum<F>(C, [&](int c) { return x[c]; }) / static_cast<F>(C);
    const F sq = reduce_sum<F>(C, [&](int c) { return (x[c] - m) * (x[c] - m); });
    const F s = F(1) / std::sqrt(sq / static_cast<F>(C) + static_cast<F>(layernorm_eps));
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                        const F* mean, const F* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const F* x = inp + static_cast<size_t>(n) * C;
    const F* d = dout + static_cast<size_t>(n) * C;
    F* dx = dinp + static_cast<size_t>(n) * C;
    const F m = mean[n];
    const F s = rstd[n];
    // dx = s * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * weight.
    for (int c = 0; c < C; ++c) {
      dbias[c] += d[c];
      dweight[c] += d[c] * (x[c] - m) * s;
    }
    const F g_mean = reduce_sum<F>(C, [&](int c) { return d[c] * weight[c]; }) / static_cast<F>(C);
    const F gx_mean = reduce_sum<F>(C, [&](int c) { return d[c] * weight[c] * (x[c] - m) * s; }) /
                      static_cast<F>(C);
    for (int c = 0; c < C; ++c) {
      const F xhat = (x[c] - m) * s;
      dx[c] += s * (d[c] * weight[c] - g_mean - xhat * gx_mean);
    }
  }
}

// ---------------------------------------------------------------- linear

template <typename F>
void linear_forward(F* out, const F* inp, const F* weight, const F* bias, int N, int C, int OC) {
  F beta = 0;
  if (bias != nullptr) {
    for (int n = 0; n < N; ++n)
      std::memcpy(out + static_cast<size_t>(n) * OC, bias, sizeof(F) * OC);
    beta = 1;
  }
  blas::gemm(false, true, N, OC, C, F(1), inp, C, weight, C, beta, out, OC);
}

template <typename F>
void linear_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                     int N, int C, int OC) {
  if (dinp != nullptr) blas::gemm(false, false, N, C, OC, F(1), dout, OC, weight, C, F(1), dinp, C);
  blas::gemm(true, false, OC, C, N, F(1), dout, OC, inp, C, F(1), dweight, C);
  if (dbias != nullptr) {
    for (int n = 0; n < N; ++n) {
      const F* d = dout + static_cast<size_t>(n) * OC;
      for (int o = 0; o < OC; ++o) dbias[o] += d[o];
    }
  }
}

// ---------------------------------------------------------------- attention

template <typename F>
void attention_forward(F* out, F* att, const F* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const F* q = qkv + static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
      const F* k = q + C;
      const F* v = q + 2 * C;
      F* a = att + (static_cast<size_t>(b) * NH + h) * T * T;
      // Scores for the whole T x T square: at T <= a few hundred one gemm beats a
      // triangular loop; the masked half is overwritten by the softmax below.
      blas::gemm(false, true, T, T, hs, scale, q, C3, k, C3, F(0), a, T);
      for (int t = 0; t < T; ++t) {
        F* row = a + static_cast<size_t>(t) * T;
        const F inv = F(1) / exp_shifted(row, row, t + 1, reduce_max(row, t + 1));
        for (int j = 0; j <= t; ++j) row[j] *= inv;
        for (int j = t + 1; j < T; ++j) row[j] = 0;
      }
      F* o = out + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hs;
      blas::gemm(false, false, T, hs, T, F(1), a, T, v, C3, F(0), o, C);
    }
  }
}

template <typename F>
void attention_backward(F* dqkv, F* scratch, const F* dout, const F* qkv, const F* att, int B,
                        int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const size_t head = static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
      const F* q = qkv + head;
      const F* k = q + C;
      const F* v = q + 2 * C;
      F* dq = dqkv + head;
      F* dk = dq + C;
      F* dv = dq + 2 * C;
      const F* p = att + (static_cast<size_t>(b) * NH + h) * T * T;
      const F* d = dout + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hs;
      F* dp = scratch;
      blas::gemm(false, true, T, T, hs, F(1), d, C, v, C3, F(0), dp, T);  // dP = dO V^T
      blas::gemm(true, false, T, hs, T, F(1), p, T, d, C, F(1), dv, C3);  // dV += P^T dO
      // Softmax backward, in place: dS = P * (dP - rowsum(P * dP)); zero above the diagonal.
      for (int t = 0; t < T; ++t) {
        const F* pr = p + static_cast<size_t>(t) * T;
        F* dr = dp + static_cast<size_t>(t) * T;
        const F dot = reduce_sum<F>(t + 1, [&](int j) { return pr[j] * dr[j]; });
        for (int j = 0; j <= t; ++j) dr[j] = pr[j] * (dr[j] - dot);
        for (int j = t + 1; j < T; ++j) dr[j] = 0;
      }
      blas::gemm(false, false, T, hs, T, scale, dp, T, k, C3, F(1), dq, C3);  // dQ += s dS K
      blas::gemm(true, false, T, hs, T, scale, dp, T, q, C3, F(1), dk, C3);   // dK += s dS^T Q
    }
  }
}

template <typename F>
void attention_forward_cached(F* out, F* scratch, const F* q, int ldq, const F* k, const F* v,
                              int ldkv, int n, int p0, int C, int NH) {
  const int hs = C / NH;
  const int L = p0 + n;  // cached positions the last new row sees
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
  for (int h = 0; h < NH; ++h) {
    const size_t col = static_cast<size_t>(h) * hs;
    // Scores of the n new rows against every cached position, then the causal softmax of
    // each row over positions 0 .. p0 + t, as attention_forward does for its square.
    blas::gemm(false, true, n, L, hs, scale, q + col, ldq, k + col, ldkv, F(0), scratch, L);
    for (int t = 0; t < n; ++t) {
      F* row = scratch + static_cast<size_t>(t) * L;
      const int seen = p0 + t + 1;
      const F inv = F(1) / exp_shifted(row, row, seen, reduce_max(row, seen));
      for (int j = 0; j < seen; ++j) row[j] *= inv;
      for (int j = seen; j < L; ++j) row[j] = 0;
    }
    blas::gemm(false, false, n, hs, L, F(1), scratch, L, v + col, ldkv, F(0), out + col, C);
  }
}

// ---------------------------------------------------------------- GELU
//
// 0.5 (1 + tanh(u)) equals sigmoid(2u), so gelu(x) = x * s with s = 1 / (1 + e^(-2u)):
// one exp and no cancellation near tanh(u) = -1. Its derivative is
// s + x * 2 s (1 - s) * du/dx with du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).

template <typename F>
void gelu_forward(F* out, const F* inp, size_t n) {
  const F k0 = static_cast<F>(gelu_k0);
  const F k1 = static_cast<F>(gelu_k1);
  size_t i = 0;
#ifdef TROUPE_HAVE_AVX2
  if constexpr (std::is_same_v<F, float>) {
    const __m256 m2k0 = _mm256_set1_ps(-2 * k0), vk1 = _mm256_set1_ps(k1);
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_loadu_ps(inp + i);
      const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
      const __m256 e = simd::exp(_mm256_mul_ps(m2k0, _mm256_fmadd_ps(vk1, x3, x)));
      _mm256_storeu_ps(out + i, _mm256_div_ps(x, _mm256_add_ps(one, e)));
    }
  }
#endif
  for (; i < n; ++i) {
    const F x = inp[i];
    out[i] = x / (F(1) + std::exp(F(-2) * k0 * (x + k1 * x * x * x)));
  }
}

template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n) {
  const F k0 = static_cast<F>(gelu_k0);
  const F k1 = static_cast<F>(gelu_k1);
  size_t i = 0;
#ifdef TROUPE_HAVE_AVX2
  if constexpr (std::is_same_v<F, float>) {
    const __m256 m2k0 = _mm256_set1_ps(-2 * k0), vk1 = _mm256_set1_ps(k1);
    const __m256 one = _mm256_set1_ps(1.0f), two_k0 = _mm256_set1_ps(2 * k0);
    const __m256 three_k1 = _mm256_set1_ps(3 * k1);
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_loadu_ps(inp + i);
      const __m256 x2 = _mm256_mul_ps(x, x);
      const __m256 e =
          simd::exp(_mm256_mul_ps(m2k0, _mm256_fmadd_ps(_mm256_mul_ps(vk1, x2), x, x)));
      const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
      const __m256 du = _mm256_mul_ps(two_k0, _mm256_fmadd_ps(three_k1, x2, one));  // 2 du/dx
      const __m256 ds = _mm256_mul_ps(_mm256_mul_ps(s, _mm256_sub_ps(one, s)), du);
      const __m256 grad = _mm256_fmadd_ps(x, ds, s);
      _mm256_storeu_ps(dinp + i,
                       _mm256_fmadd_ps(grad, _mm256_loadu_ps(dout + i), _mm256_loadu_ps(dinp + i)));
    }
  }
#endif
  for (; i < n; ++i) {
    const F x = inp[i];
    const F s = F(1) / (F(1) + std::exp(F(-2) * k0 * (x + k1 * x * x * x)));
    const F du = k0 * (F(1) + F(3) * k1 * x * x);
    dinp[i] += (s + x * F(2) * s * (F(1) - s) * du) * dout[i];
  }
}

// ---------------------------------------------------------------- residual

template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename F>
void residual_backward(F* da, F* db, const F* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

// ---------------------------------------------------------------- softmax + cross-entropy

template <typename F>
double softmax_crossentropy_forward(F* probs, const F* logits, const token_id* targets, int N,
                                    int V) {
  double loss = 0;
  for (int n = 0; n < N; ++n) {
    const F* l = logits + static_cast<size_t>(n) * V;
    F* p = probs + static_cast<size_t>(n) * V;
    const F mx = reduce_max(l, V);
    const F target_logit = l[targets[n]];  // read before p (which may alias l) is written
    const F sum = exp_shifted(p, l, V, mx);
    // -log softmax = log(sum) + max - logit: exact even when the probability underflows.
    loss += static_cast<double>(std::log(sum) + mx - target_logit);
    const F inv = F(1) / sum;
    for (int v = 0; v < V; ++v) p[v] *= inv;
  }
  return loss;
}

template <typename F>
void softmax_crossentropy_backward(F* dlogits, const F* probs, const token_id* targets, F dloss,
                                   int N, int V) {
  for (int n = 0; n < N; ++n) {
    const F* p = probs + static_cast<size_t>(n) * V;
    F* d = dlogits + static_cast<size_t>(n) * V;
    for (int v = 0; v < V; ++v) d[v] += dloss * p[v];
    d[targets[n]] -= dloss;
  }
}

// ---------------------------------------------------------------- instantiations

// One list for both scalar types. F names a type here, where the parentheses that
// bugprone-macro-parentheses asks for would not compile.
// clang-format off
// NOLINTBEGIN(bugprone-macro-parentheses)
#define TROUPE_LAYERS_INSTANTIATE(F)                                                          \
  template void embedding_forward<F>(F*, const token_id*, const F*, const F*, int, int, int);  \
  template void embedding_backward<F>(F*, F*, const F*, const token_id*, int, int, int);       \
  template void layernorm_forward<F>(F*, F*, F*, const F*, const F*, const F*, int, int);     \
  template void layernorm_backward<F>(F*, F*, F*, const F*, const F*, const F*, const F*,     \
                                      const F*, int, int);                                    \
  template void linear_forward<F>(F*, const F*, const F*, const F*, int, int, int);           \
  template void linear_backward<F>(F*, F*, F*, const F*, const F*, const F*, int, int, int);  \
  template void attention_forward<F>(F*, F*, const F*, int, int, int, int);                   \
  template void attention_backward<F>(F*, F*, const F*, const F*, const F*, int, int, int,    \
                                      int);                                                   \
  template void attention_forward_cached<F>(F*, F*, const F*, int, const F*, const F*, int,   \
                                            int, int, int, int);                              \
  template void gelu_forward<F>(F*, const F*, size_t);                                        \
  template void gelu_backward<F>(F*, const F*, const F*, size_t);                             \
  template void residual_forward<F>(F*, const F*, const F*, size_t);                          \
  template void residual_backward<F>(F*, F*, const F*, size_t);                               \
  template double softmax_crossentropy_forward<F>(F*, const F*, const token_id*, int, int);    \
  template void softmax_crossentropy_backward<F>(F*, const F*, const token_id*, F, int, int);

TROUPE_LAYERS_INSTANTIATE(float)
TROUPE_LAYERS_INSTANTIATE(double)

#undef TROUPE_LAYERS_INSTANTIATE
// NOLINTEND(bugprone-macro-parentheses)
// clang-format on

}  // namespace troupe::layers
