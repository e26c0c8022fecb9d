#pragma once
// Test helper: the whole single-rank state of a layout, assembled from each rank's buffers
// by its state map (the same map checkpoints use), without any collective.

#include <mutex>
#include <span>
#include <vector>

#include "checkpoint/state_map.hpp"
#include "strategies/state_layout.hpp"

namespace troupe::testing {

struct full_model_state {
  std::vector<float> params, exp_avg, exp_avg_sq;
};

/// Places the state of one rank (a training_engine or an engine_backend) into `into`, which
/// is sized on first use. Call it once per rank; thread-safe through `mu`.
template <class Engine>
void place_rank_state(Engine& engine, const model_config& model, full_model_state& into,
                      std::mutex& mu) {
  const auto tensors = strategies::tensor_table(model);
  size_t numel = 0;
  for (const auto& t : tensors) {
    const auto [rows, cols] = ckpt::as_matrix(t.shape);
    numel = std::max(numel, t.offset + static_cast<size_t>(rows * cols));
  }
  auto state = engine.state();
  const std::vector<std::span<const float>> buffers(state.buffers.begin(), state.buffers.end());
  std::lock_guard lock(mu);
  if (into.params.empty()) {
    into.params.assign(numel, 0.0f);
    into.exp_avg.assign(numel, 0.0f);
    into.exp_avg_sq.assign(numel, 0.0f);
  }
  const std::span<float> full[] = {into.params, into.exp_avg, into.exp_avg_sq};
  ckpt::place_into_full(engine.state_map(), buffers, tensors, full);
}

}  // namespace troupe::testing
