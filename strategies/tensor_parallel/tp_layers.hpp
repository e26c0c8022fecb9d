#pragma once
// Megatron-style tensor-parallel layers: the local math of runtime/model/layers.hpp on one
// rank's slice of a matrix, plus the one collective each parallel region needs.
//
// Shapes as in layers.hpp (N rows, C channels, V vocabulary); a suffix _l marks this rank's
// share of a sharded dimension (OC_l = OC / t, V_l = V / t for a group of t ranks). Every
// buffer is float: the data plane reduces floats. Backward functions ACCUMULATE (+=) into
// their outputs like layers.hpp, except where a comment says a buffer is overwritten: an
// all-reduce must see only its own layer's partial sums, never what was already there.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/data/token.hpp"

namespace troupe::tensor_parallel {

/// The tree a group sums along in rank order: one leaf per rank (rank r holds leaf r), and the
/// buffers the sums reuse.
struct rank_order_tree {
  explicit rank_order_tree(int ranks);
  std::vector<std::vector<comm::tree_node>> pieces;
  std::vector<float> leaf;  ///< this rank's leaf: the sum may not be written over it
  comm::tree_sum_buffers buffers;
};

/// The tensor-parallel group a layer reduces over, and the deadline of each collective.
struct tp_group {
  comm::communicator* comm = nullptr;
  comm::op_options opts;
  /// Set (--reduction exact, 3 ranks or more): every sum is the rank-order tree
  /// (communicator::all_reduce_tree), so its bits do not depend on the transport the group
  /// runs on (shared memory on one node, the gloo ring across nodes). Two ranks' sum is one
  /// addition per float, the same in any order, so two need none.
  std::shared_ptr<rank_order_tree> rank_order;

  int rank() const { return comm->rank(); }
  int size() const { return comm->size(); }
};

/// Every rank's `x` summed over the group, into `x` on every rank (in rank order when the
/// group says so).
void tp_sum(const tp_group& g, float* x, size_t n);

/// The region after a row-parallel layer, forward: each rank holds a partial sum of x[n];
/// afterwards every rank holds the full sum. Its backward is the identity (no collective).
void reduce_from_tensor_parallel_region(const tp_group& g, float* x, size_t n);

/// The region before a column-parallel layer, backward: the forward is the identity (every
/// rank already holds the replicated input), and the input gradient is the sum of each
/// rank's partial gradient dx[n], computed from its own output columns.
void copy_to_tensor_parallel_region_backward(const tp_group& g, float* dx, size_t n);

/// Column-parallel linear: out_l[N,OC_l] = inp[N,C] * weight_l[OC_l,C]^T + bias_l (bias may
/// be null). No collective in forward.
void column_parallel_linear_forward(float* out_l, const float* inp, const float* weight_l,
                                    const float* bias_l, int N, int C, int OC_l);
/// Accumulates dweight_l and dbias_l (may be null) and OVERWRITES dinp[N,C] with the full
/// input gradient: the sum over the group of dout_l * weight_l (one all-reduce).
void column_parallel_linear_backward(const tp_group& g, float* dinp, float* dweight_l,
                                     float* dbias_l, const float* dout_l, const float* inp,
                                     const float* weight_l, int N, int C, int OC_l);

/// Row-parallel linear: out[N,OC] (OVERWRITTEN) = sum over the group of
/// inp_l[N,C_l] * weight_l[OC,C_l]^T, then + bias[OC] (replicated, may be null), added once
/// after the all-reduce so it is not counted t times.
void row_parallel_linear_forward(const tp_group& g, float* out, const float* inp_l,
                                 const float* weight_l, const float* bias, int N, int C_l, int OC);
/// Accumulates dinp_l, dweight_l and dbias (the replicated bias gets the same gradient on
/// every rank, since dout is replicated). No collective: the input is sharded, so each rank's
/// input gradient is complete for its own columns.
void row_parallel_linear_backward(float* dinp_l, float* dweight_l, float* dbias, const float* dout,
                                  const float* inp_l, const float* weight_l, int N, int C_l,
                                  int OC);

/// Vocabulary-parallel embedding: out[b,t,:] (OVERWRITTEN) = wte[inputs[b,t],:] + wpe[t,:],
/// where this rank holds rows [vocab_start, vocab_start + V_l) of wte as wte_l. Rows it does
/// not own contribute zeros to one all-reduce; the replicated wpe is added after it.
void vocab_parallel_embedding_forward(const tp_group& g, float* out, const token_id* inputs,
                                      const float* wte_l, int vocab_start, int V_l,
                                      const float* wpe, int B, int T, int C);
/// Accumulates dwte_l for the tokens this rank owns and dwpe (replicated). No collective.
void vocab_parallel_embedding_backward(float* dwte_l, float* dwpe, const float* dout,
                                       const token_id* inputs, int vocab_start, int V_l, int B,
                                       int T, int C);

/// Floats of workspace vocab_parallel_cross_entropy_forward needs for N rows on t ranks.
inline size_t cross_entropy_workspace(int N, int t) {
  return static_cast<size_t>(N) * static_cast<size_t>(t + 3);
}

/// Softmax over the full vocabulary and cross-entropy against targets[N], from this rank's
/// logits_l[N,V_l] (vocabulary columns [vocab_start, vocab_start + V_l)) without gathering
/// the full logits. Writes this rank's probabilities probs_l (may alias logits_l). Two
/// all-reduces: the row maxima (every rank's maxima, gathered by a sum into `work`), then
/// the partial sums of exp together with the target logit, which only its owner contributes.
/// Returns the SUM of the N per-row losses, the same on every rank.
double vocab_parallel_cross_entropy_forward(const tp_group& g, float* probs_l,
                                            const float* logits_l, const token_id* targets, int N,
                                            int vocab_start, int V_l, float* work);
/// dlogits_l += dloss * (probs_l - onehot(targets) restricted to this rank's columns).
/// No collective.
void vocab_parallel_cross_entropy_backward(float* dlogits_l, const float* probs_l,
                                           const token_id* targets, float dloss, int N,
                                           int vocab_start, int V_l);

}  // namespace troupe::tensor_parallel
