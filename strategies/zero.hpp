#pragma once
// ZeRO stage 1: the optimizer state is sharded over the data-parallel group. Gradients are
// reduce-scattered, each rank updates only the parameters it owns, and the updated
// parameters are all-gathered back, so optimizer memory per rank falls as 1/dp.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/config.hpp"
#include "runtime/model/gpt.hpp"
#include "runtime/optim/adamw.hpp"

namespace troupe::strategies {

/// The contiguous slice of the flat parameter layout one data-parallel rank owns. Slices
/// are equal (`block` floats, the last one shorter) so reduce-scatter and all-gather work
/// on equal blocks; together they tile [0, num_params).
struct zero_shard {
  size_t block = 0;   ///< ceil(num_params / dp), rounded up to a multiple of the alignment
  size_t offset = 0;  ///< first owned parameter
  size_t count = 0;   ///< owned parameters (block, or less for the last ranks; maybe 0)
};
/// `align`: every shard starts at a multiple of it (the exact reduction's norm blocks).
zero_shard zero_shard_of(size_t num_params, int dp_rank, int dp_size, size_t align = 1);

/// How a ZeRO-1 optimizer sums and clips: the fast way, or the exact reduction's
/// (strategies/exact_reducer.hpp): shards aligned to its norm blocks, the gradient clipped by
/// a float factor as the replicated optimizer clips, so that ZeRO-1 gives dp's bits.
struct zero_options {
  size_t align = 1;
  bool float_clip = false;
};

/// The weight-decay table of `full_table` restricted to a shard, offsets made relative to it.
std::vector<param_tensor> shard_table(const std::vector<param_tensor>& full_table,
                                      const zero_shard& shard);

class zero1_optimizer {
 public:
  zero1_optimizer(const optim_config& cfg, const std::vector<param_tensor>& table,
                  size_t num_params, int dp_rank, int dp_size, zero_options options = {});

  /// Stage 3, before the vote: sums every rank's gradients and keeps this rank's shard.
  void reduce_gradients(comm::communicator& dp, const float* grads, const comm::op_options& opts);
  /// Stage 4, after the commit: clips by the global gradient norm (over all shards), updates
  /// the owned parameters with AdamW and all-gathers every rank's updated parameters into
  /// `params` (the full flat buffer). Returns the global norm before clipping.
  double apply(comm::communicator& dp, float* params, int64_t step, int64_t total_steps,
               const comm::op_options& opts);
  /// The global gradient norm given this rank's reduced gradient shard; for layouts whose
  /// norm also spans tensor-parallel shards or pipeline stages (a collective over them).
  using norm_fn = std::function<double(const float* grad_shard, const zero_shard& shard)>;
  /// apply() with the norm computed by `global_norm` instead of over the dp group alone.
  double apply(comm::communicator& dp, float* params, int64_t step, int64_t total_steps,
               const comm::op_options& opts, const norm_fn& global_norm);

  const zero_shard& shard() const { return shard_; }
  /// This rank's summed gradients (shard().block floats), for a reduction done elsewhere
  /// (the exact reducer's reduce_scatter) in place of reduce_gradients().
  float* grad_shard() { return grad_shard_.data(); }
  double learning_rate(int64_t step, int64_t total_steps) const {
    return adam_.learning_rate(step, total_steps);
  }
  /// Shard state, for checkpoints (each `shard().count` long).
  std::vector<float>& exp_avg() { return adam_.exp_avg(); }
  std::vector<float>& exp_avg_sq() { return adam_.exp_avg_sq(); }
  int64_t& t() { return adam_.t(); }
  /// Bytes of optimizer state this rank holds (both moments), as allocated.
  size_t state_bytes() const;

 private:
  size_t num_params_;
  int dp_size_;
  zero_options options_;
  zero_shard shard_;
  adamw adam_;
  std::vector<float> padded_;       // dp * block floats: reduce-scatter input / all-gather output
  std::vector<float> grad_shard_;   // block floats: this rank's summed gradients
  std::vector<float> param_shard_;  // block floats: this rank's parameters during the update
};

}  // namespace troupe::strategies
