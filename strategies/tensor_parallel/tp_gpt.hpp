#pragma once
// One rank's shard of the GPT under tensor parallelism over a group of t ranks: its slice of
// every matrix, the forward and backward pass with the group's all-reduces, and the map from
// its local tensors to the single-rank model's flat layout.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/config.hpp"
#include "runtime/model/gpt.hpp"
#include "strategies/tensor_parallel/tp_layers.hpp"

namespace troupe::tensor_parallel {

/// A rectangle of a full tensor that one local tensor holds. Tensors are viewed as 2-D:
/// [rows, cols] for matrices, [1, n] for vectors. The rectangle's rows are stored one after
/// another in the local tensor starting at local_offset, each `cols` long, with the local
/// tensor's own column count as the leading dimension.
struct shard_box {
  int64_t row = 0;  ///< first row in the full tensor
  int64_t col = 0;  ///< first column in the full tensor
  int64_t rows = 0;
  int64_t cols = 0;
  size_t local_offset = 0;  ///< first element inside the local tensor
};

/// One tensor of a rank's shard and where it lives in the single-rank model.
struct shard_tensor {
  param_tensor local;               ///< full-model name, local shape, offset in the shard
  std::vector<int64_t> full_shape;  ///< shape in the single-rank model
  size_t full_offset = 0;           ///< first element in the single-rank flat buffer
  bool replicated = false;          ///< every tp rank holds the whole tensor
  std::vector<shard_box> boxes;     ///< the pieces of the full tensor this rank holds
};

/// The part of the model a pipeline stage holds: blocks [first_layer, last_layer), the
/// embedding when it is the first stage, ln_f and the tied head when it is the last. The
/// default is the whole model (one stage). A last stage that is not also the first holds a
/// copy of wte for its head (Megatron's tied-embedding copy): its gradient must be summed
/// with the first stage's before the update, and it is left out of gathers and norms.
struct stage_span {
  int first_layer = 0;
  int last_layer = -1;  ///< exclusive; -1 means n_layer
  bool embedding = true;
  bool head = true;
};

/// The GPT of runtime/model/gpt.hpp sharded Megatron-style over the tp group `tp_comm`
/// (rank r of t). Per block:
///   - attn.qkv is column-parallel: rank r owns heads [r NH/t, (r+1) NH/t), i.e. rows
///     [r C/t, (r+1) C/t) of each of the q, k and v thirds of the weight and bias, laid out
///     locally as [q_r; k_r; v_r] so the local attention runs unchanged on its NH/t heads;
///   - attn.proj is row-parallel: its input columns [r C/t, (r+1) C/t); one all-reduce of
///     its output (reduce_from_tensor_parallel_region), then the replicated bias;
///   - mlp.fc is column-parallel (rows [r 4C/t, (r+1) 4C/t)), mlp.proj row-parallel
///     (those input columns), one all-reduce after it;
///   - in backward, one all-reduce per column-parallel layer: the sum of its input gradient
///     (the conjugate of copy_to_tensor_parallel_region).
/// wte is vocabulary-parallel (rows [r V/t, (r+1) V/t)), both as the embedding and as the
/// tied head, whose cross-entropy never gathers the full logits. wpe, the LayerNorms and the
/// row-parallel biases are replicated.
///
/// Replicated gradients need no reduction: every replicated tensor's gradient is computed
/// from values that are either the output of an all-reduce or computed identically from such
/// outputs, so each rank holds the same bits, provided the backend returns bitwise-identical
/// results to every rank (gloo's ring and small-message all-reduce do; so does NCCL's ring).
/// tensor_parallel_test checks it bitwise for tp = 2 and 4. Their updates (AdamW is
/// elementwise) therefore stay identical too.
///
/// Collectives per pass, for L layers (t > 1; none when t == 1):
///   forward  = 2L + 3 all-reduces (embedding 1, row-parallel 2 per block, cross-entropy 2);
///   backward = 2L + 1 all-reduces (column-parallel input gradient 2 per block, the head 1).
/// Every rank of the group must make the same calls with the same inputs, targets, B and T
/// (the tokens are replicated; only the weights are sharded).
///
/// Not thread-safe (activation buffers are reused). Only the dense model (experts == 0).
class tp_gpt {
 public:
  /// Throws std::invalid_argument with the reason when the shape cannot be split t ways
  /// (n_head or vocab not divisible by t; t dividing n_head also divides C and 4C), for an
  /// MoE config, or for a config gpt rejects. Makes no collective call. Builds a transient
  /// single-rank gpt to validate the shape and read its layout (memory: one full model).
  tp_gpt(const model_config& cfg, comm::communicator& tp_comm, comm::op_options opts = {},
         stage_span span = {});

  const stage_span& span() const { return span_; }
  /// Whether this stage's wte is a copy of the first stage's (see stage_span).
  bool holds_tied_copy() const { return span_.head && !span_.embedding; }
  /// Local offset and size of wte, for the tied-embedding reduction; throws when absent.
  size_t wte_offset() const;
  size_t wte_numel() const;
  /// Whether table entry `i` counts in the full model's gradient norm on this rank: sharded
  /// tensors always, replicated ones on tp rank 0 only, the tied copy never.
  bool counts_in_norm(size_t i) const;

  const model_config& config() const { return cfg_; }
  int tp_rank() const { return group_.rank(); }
  int tp_size() const { return group_.size(); }
  comm::communicator& tp_comm() { return *group_.comm; }
  /// Rebinds the shard to a new generation's communicator for the same place (same rank and
  /// size; throws std::invalid_argument otherwise). A different tp size needs a new tp_gpt,
  /// loaded from the full model (gather_full_params or a checkpoint). The communicator must
  /// outlive its use here.
  void set_tp_comm(comm::communicator& tp_comm);
  /// The deadline of every collective this shard issues.
  void set_op_options(const comm::op_options& opts) { group_.opts = opts; }
  /// --reduction exact: the model's tp sums in rank order on any transport (3 ranks or more;
  /// two ranks' sums have one order already).
  void sum_in_rank_order(bool on) {
    group_.rank_order =
        on && tp_size() >= 3 ? std::make_shared<rank_order_tree>(tp_size()) : nullptr;
  }

  /// Values in this rank's shard; params() and grads() hold this many.
  size_t num_params() const { return params_.size(); }
  /// The shard's tensors in its flat buffer; offsets are local, names are the full model's.
  /// Pass it to adamw with num_params() for a per-shard optimizer.
  const std::vector<param_tensor>& param_table() const { return table_; }
  /// The same tensors with their place in the single-rank model.
  const std::vector<shard_tensor>& shard_table() const { return shards_; }
  /// Values in the single-rank model's flat buffer.
  size_t full_num_params() const { return full_numel_; }

  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }

  /// This rank's slices of exactly what gpt::init_params(seed) produces: the full model is
  /// initialised once (transiently, on each rank) and sliced, so the two can never drift.
  void init_params(uint64_t seed);
  void zero_grads();
  /// Exchanges the gradient buffer with `other` (num_params() values; std::invalid_argument
  /// otherwise): the exact reduction takes each micro-batch's gradient without a copy.
  void swap_grads(std::vector<float>& other);

  /// As gpt::forward_backward: accumulates grad_scale * d(mean loss)/d(shard) into grads()
  /// and returns the mean cross-entropy (the same on every rank). Collective.
  double forward_backward(const token_id* inputs, const token_id* targets, int B, int T,
                          float grad_scale);
  /// The mean loss only. Collective.
  double forward_loss(const token_id* inputs, const token_id* targets, int B, int T);

  /// Copies this rank's slices out of a single-rank flat buffer (full_num_params() values).
  /// Local; every rank passes the same full buffer.
  void load_from_full(const float* full);
  /// Rebuilds the single-rank flat parameters on EVERY rank (one all-reduce of
  /// full_num_params() floats; replicated tensors come from tp rank 0). Collective.
  void gather_full_params(float* full) { gather_full(params_.data(), full); }
  /// The same for gradients.
  void gather_full_grads(float* full) { gather_full(grads_.data(), full); }
  /// Scatters any local flat buffer (num_params()) into a full one; see gather_full_params.
  void gather_full(const float* local, float* full);

  /// L2 norm of the full model's gradient: the sum of squares of the sharded tensors over
  /// the group (one all-reduce of one float) plus that of the replicated tensors, counted
  /// once. The same on every rank. Collective.
  double global_grad_norm();

  /// Pipeline passes over micro-batch activations kept in `slot` (0 <= slot < slots given
  /// to reserve_slots). A first stage reads `inputs`; any other stage reads the activation
  /// placed in stage_input(slot). A last stage returns the mean loss; any other stage
  /// returns 0 and leaves its output in stage_output(slot). Collective over the tp group.
  void reserve_slots(int B, int slots);
  double forward_stage(int slot, const token_id* inputs, const token_id* targets, int B, int T);
  /// A last stage starts from the loss (scaled by grad_scale / (B T), like forward_backward);
  /// any other stage from the gradient placed in output_grad(). A first stage ends in the
  /// embedding; any other stage leaves the gradient of its input in input_grad().
  void backward_stage(int slot, const token_id* inputs, const token_id* targets, int B, int T,
                      float grad_scale);
  /// [B * T * d_model] buffers for the pipeline's send/recv.
  float* stage_input(int slot);
  const float* stage_output(int slot) const;
  float* output_grad() { return dres_out_.data(); }
  const float* input_grad() const { return dres_out_.data(); }

  /// The numbers of all-reduces above, for a model of n_layer blocks and t > 1.
  static constexpr int all_reduces_per_forward(int n_layer) { return 2 * n_layer + 3; }
  static constexpr int all_reduces_per_backward(int n_layer) { return 2 * n_layer + 1; }

 private:
  struct block_view;
  block_view block(float* base, int l) const;
  void check_batch(int B, int T) const;
  void reserve(int B) { reserve_slots(B, 1); }
  void check_whole_model() const;
  int layers() const { return span_.last_layer - span_.first_layer; }

  model_config cfg_;
  stage_span span_;
  tp_group group_;
  // Local offsets of the tensors the passes address directly.
  size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
  std::vector<std::array<size_t, 12>> block_offsets_;  // per local layer, in block_view's order
  bool has_wte_ = false, has_wpe_ = false;
  int C_l_ = 0;   // attention channels (heads * head size) on this rank: C / t
  int NH_l_ = 0;  // heads on this rank
  int F_l_ = 0;   // MLP hidden width on this rank: 4C / t
  int V_l_ = 0;   // vocabulary rows on this rank
  int vocab_start_ = 0;
  size_t full_numel_ = 0;
  std::vector<param_tensor> table_;
  std::vector<shard_tensor> shards_;
  std::vector<float> params_;
  std::vector<float> grads_;

  // Activations, sized for the largest B seen (B * context rows) and reused; one set per
  // micro-batch a pipeline stage keeps alive.
  struct layer_acts {
    std::vector<float> ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2;
    std::vector<float> ln2, ln2_mean, ln2_rstd, fch, fch_gelu, res3;
  };
  struct slot_acts {
    std::vector<float> encoded;  // the residual stream entering this stage's first block
    std::vector<layer_acts> layers;
    std::vector<float> lnf, lnf_mean, lnf_rstd, logits;  // last stage only
  };
  int capacity_b_ = 0;
  std::vector<slot_acts> slots_;
  std::vector<float> proj_, ce_work_;
  // Activation gradients, one block's worth reused by every block.
  std::vector<float> dres_out_, dres_in_, dres2_, dproj_, dfch_gelu_, dfch_, dln2_, datty_;
  std::vector<float> dqkv_, dln1_, scratch_, dlnf_, dlogits_;
};

}  // namespace troupe::tensor_parallel
