#pragma once
// The training step of one tensor-parallel shard in a dp x tp layout: which samples it
// computes, how its micro-batch gradients are scaled, and clipping by the full model's norm.

#include <cstdint>

#include "runtime/config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/optim/adamw.hpp"
#include "runtime/trainer.hpp"
#include "strategies/tensor_parallel/tp_gpt.hpp"

namespace troupe::tensor_parallel {

/// runtime/trainer.hpp's compute_gradients for a shard: data-parallel rank dp_rank of
/// dp_world takes global samples [dp_rank G/D, (dp_rank+1) G/D) of step `step` in
/// micro-batches of at most cfg.micro_batch, each scaled by B/G. Every tp rank of one
/// data-parallel replica must call this with the same dp_rank (they compute the same samples
/// on different slices; the passes are collective over the tp group). m.grads() is zeroed
/// first; summing them over the dp group (same tp rank) gives this shard's slice of the
/// global-batch gradient. loss_sum and tokens are this replica's (the same on its tp ranks),
/// so sum them over the dp group only, not over tp. Throws std::invalid_argument on a bad
/// dp_rank, dp_world or batch.
grad_result compute_tp_gradients(tp_gpt& m, const token_dataset& d, const train_config& cfg,
                                 int64_t step, int dp_rank, int dp_world);

/// adamw::clip_gradients for a shard: scales m.grads() by opt.clip_scale(norm) of the FULL
/// model's gradient norm (tp_gpt::global_grad_norm) and returns that norm. Call it after the
/// data-parallel reduction, then opt.step(m.params(), m.grads(), ...) with an adamw built on
/// m.param_table() and m.num_params(). A non-finite norm leaves the gradients alone so the
/// caller can skip the step. Collective over the tp group.
double clip_tp_gradients(tp_gpt& m, const adamw& opt);

}  // namespace troupe::tensor_parallel
