// How the global flat state is split among the ranks of a data-parallel world.

#include <algorithm>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "runtime/balanced_split.hpp"

namespace troupe::ckpt {

shard_range owned_range(size_t global_numel, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw checkpoint_error(error_kind::invalid_argument, "",
                           "checkpoint: owned_range: rank " + std::to_string(rank) +
                               " is not in a world of " + std::to_string(world) +
                               "; this is a bug in the caller.");
  }
  const balanced_run run =
      balanced_part(global_numel, static_cast<size_t>(world), static_cast<size_t>(rank));
  return {run.offset, run.count};
}

shard_state slice_state(const full_state& full, int rank, int world) {
  const size_t n = full.params.size();
  if (full.exp_avg.size() != n || full.exp_avg_sq.size() != n) {
    throw checkpoint_error(error_kind::invalid_argument, "",
                           "checkpoint: slice_state: params, exp_avg and exp_avg_sq differ in "
                           "length; this is a bug in the caller.");
  }
  shard_state s;
  s.rank = rank;
  s.world = world;
  s.step = full.step;
  s.adam_t = full.adam_t;
  s.seed = full.seed;
  s.rng_state = full.rng_state;
  s.global_numel = n;
  s.range = owned_range(n, rank, world);
  const auto slice = [&](const std::vector<float>& v) {
    const auto first = v.begin() + static_cast<std::ptrdiff_t>(s.range.offset);
    return std::vector<float>(first, first + static_cast<std::ptrdiff_t>(s.range.count));
  };
  s.params = slice(full.params);
  s.exp_avg = slice(full.exp_avg);
  s.exp_avg_sq = slice(full.exp_avg_sq);
  return s;
}

}  // namespace troupe::ckpt
