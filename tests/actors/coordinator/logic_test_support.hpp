#pragma once
// What the tests of job_logic share: picking actions of one kind out of a batch, and the small
// job they drive.

#include <variant>
#include <vector>

#include "actors/coordinator/job/job_actions.hpp"
#include "runtime/config.hpp"

namespace troupe::actors::test_support {

/// The actions of type T in `a`, in order.
template <class T>
std::vector<T> all_of(const actions& a) {
  std::vector<T> out;
  for (const auto& x : a)
    if (auto* p = std::get_if<T>(&x)) out.push_back(*p);
  return out;
}

/// A GPT small enough that planning and state sizes cost nothing, on `world` ranks.
inline train_config small_config(int world) {
  train_config cfg;
  cfg.world = world;
  cfg.steps = 100;
  cfg.batch = 8;
  cfg.micro_batch = 2;
  cfg.checkpoint_every = 5;
  cfg.eval_every = 0;
  cfg.model.n_layer = 2;
  cfg.model.n_head = 2;
  cfg.model.d_model = 32;
  cfg.model.context = 32;
  cfg.step_timeout_ms = 10000;
  return cfg;
}

}  // namespace troupe::actors::test_support
