#pragma once
// The state maps of the backends (checkpoint/state_map.hpp): which boxes of the single-rank
// model each rank holds, and which share of them it writes. One place for the rules of who
// holds a copy of what: dp replicas hold the same values; tp ranks all hold a replicated
// tensor; the last pipeline stage's tied copy of wte is the first stage's to save.

#include <vector>

#include "checkpoint/state_map.hpp"
#include "runtime/model/gpt.hpp"
#include "strategies/tensor_parallel/tp_gpt.hpp"

namespace troupe::strategies {

/// A tp_gpt shard's parameter pieces. Sharded boxes are shared by the `dp` replicas;
/// replicated tensors by dp * tp ranks (index tp_rank * dp + dp_index), so dividing both
/// by dp gives the holders of a ZeRO-1 moment shard.
std::vector<ckpt::placed_piece> pieces_of(const tensor_parallel::tp_gpt& model, int dp,
                                          int dp_index);

/// A single-rank model's pieces: every tensor whole, shared by `holders` ranks.
std::vector<ckpt::placed_piece> pieces_of(const gpt& model, int holders, int index);

/// The same pieces for the parameters and both AdamW moments (replicated optimizer).
ckpt::state_map replicated_state_map(std::vector<ckpt::placed_piece> params);

/// Parameters as `params`; moments a ZeRO-1 shard [offset, offset + count) of the local
/// buffer, held by the ranks of `params` divided by dp (see pieces_of).
ckpt::state_map zero_state_map(std::vector<ckpt::placed_piece> params, size_t offset, size_t count,
                               int dp);

/// The single-rank model's tensors, as a manifest lists them.
std::vector<ckpt::tensor_shape> tensor_table(const model_config& cfg);

}  // namespace troupe::strategies
