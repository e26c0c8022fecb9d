#pragma once
// The GPT's layers as symmetric forward/backward pairs on flat row-major arrays.
//
// Shapes are named once: B sequences of T tokens, N = B * T rows, C channels, OC output
// channels, V vocabulary, NH heads of C / NH channels. Every function is a template over
// the scalar type F and is instantiated for float (training) and double (gradient checks).
//
// Convention for every *_backward: gradients are ACCUMULATED (+=) into all d* outputs,
// parameter and activation gradients alike, so callers zero activation-gradient buffers
// once and the residual stream can sum contributions from several branches.

#include <cstddef>
#include <cstdint>

#include "runtime/data/token.hpp"

namespace troupe::layers {

/// out[b,t,:] = wte[inputs[b,t],:] + wpe[t,:]. wte is [V,C], wpe is [>=T,C].
template <typename F>
void embedding_forward(F* out, const token_id* inputs, const F* wte, const F* wpe, int B, int T,
                       int C);
template <typename F>
void embedding_backward(F* dwte, F* dwpe, const F* dout, const token_id* inputs, int B, int T,
                        int C);

/// Per row: out = (inp - mean) * rstd * weight + bias, with rstd = 1/sqrt(var + 1e-5).
/// mean and rstd ([N] each) are saved for the backward pass.
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias,
                       int N, int C);
template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                        const F* mean, const F* rstd, int N, int C);

/// out[N,OC] = inp[N,C] * weight[OC,C]^T + bias[OC]; bias may be null.
template <typename F>
void linear_forward(F* out, const F* inp, const F* weight, const F* bias, int N, int C, int OC);
/// dbias may be null (no bias); dinp may be null (input needs no gradient).
template <typename F>
void linear_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                     int N, int C, int OC);

/// Causal multi-head self-attention on a fused projection qkv[N,3C] (q, k, v side by side,
/// head h in columns h*hs .. (h+1)*hs of each). Writes out[N,C] and the attention
/// probabilities att[B,NH,T,T] (zero above the diagonal) that the backward pass needs.
template <typename F>
void attention_forward(F* out, F* att, const F* qkv, int B, int T, int C, int NH);
/// scratch holds T*T values of workspace.
template <typename F>
void attention_backward(F* dqkv, F* scratch, const F* dout, const F* qkv, const F* att, int B,
                        int T, int C, int NH);

/// Inference (runtime/model/generate.hpp): causal attention of n new rows at positions
/// p0 .. p0 + n - 1 against a cache of keys and values of positions 0 .. p0 + n - 1. q holds the
/// n query rows (row stride ldq), k and v the cached rows (row stride ldkv), head h in columns
/// h*hs .. (h+1)*hs of each as in attention_forward. Writes out[n,C]; scratch holds
/// n * (p0 + n) values. Row t of the result is row p0 + t of attention_forward over the whole
/// sequence: the same scaled scores, masked softmax and weighted sum.
template <typename F>
void attention_forward_cached(F* out, F* scratch, const F* q, int ldq, const F* k, const F* v,
                              int ldkv, int n, int p0, int C, int NH);

/// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename F>
void gelu_forward(F* out, const F* inp, size_t n);
template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n);

/// out = a + b, the skip connection around each block.
template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n);
template <typename F>
void residual_backward(F* da, F* db, const F* dout, size_t n);

/// Row-wise softmax of logits[N,V] into probs[N,V] (probs may alias logits) and the
/// cross-entropy against targets[N]. Returns the SUM of the N per-row losses (nats).
template <typename F>
double softmax_crossentropy_forward(F* probs, const F* logits, const token_id* targets, int N,
                                    int V);
/// dlogits += dloss * (probs - onehot(targets)): the gradient of dloss * sum of losses.
template <typename F>
void softmax_crossentropy_backward(F* dlogits, const F* probs, const token_id* targets, F dloss,
                                   int N, int V);

}  // namespace troupe::layers
