#pragma once
// The job both supervisor tests start: a tiny data-parallel job that never checkpoints or
// evaluates, reporting to the test's event log, metrics and listener.

#include <string>

#include "actors/coordinator/job_supervisor.hpp"
#include "strategies/planner.hpp"

namespace troupe::actors::test {

inline job_setup small_job_setup(int world, int steps, const std::string& run_dir,
                                 monitoring::event_log& events,
                                 monitoring::metrics_registry& metrics, caf::actor listener) {
  job_setup s;
  s.cfg.world = world;
  s.cfg.batch = 8;
  s.cfg.micro_batch = 2;
  s.cfg.steps = steps;
  s.cfg.checkpoint_every = 0;
  s.cfg.eval_every = 0;
  s.cfg.progress = false;
  s.cfg.run_dir = run_dir;
  s.events = &events;
  s.metrics = &metrics;
  s.listener = std::move(listener);
  s.plan = strategies::plan_of(strategies::plan_layout(world, s.cfg));
  return s;
}

}  // namespace troupe::actors::test
