#pragma once
// The root of the supervisor tree: owns the generation number and the job's state
// machine (forming -> training -> done / failed), collects step votes and commits them.

#include "actors/messages.hpp"
#include "monitoring/event_log.hpp"
#include "monitoring/metrics.hpp"
#include "runtime/config.hpp"
#include "strategies/mesh.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <cstdint>
#include <string>

namespace troupe::actors {

/// What the coordinator process hands its job_supervisor. The event log and the metrics
/// registry belong to the coordinator process and outlive the actor.
struct job_setup {
  train_config cfg;
  std::string store_host;
  uint16_t store_port = 0;
  int64_t start_step = 0;                 ///< steps already committed (resume)
  monitoring::event_log* events = nullptr;
  monitoring::metrics_registry* metrics = nullptr;
  caf::actor listener;                    ///< receives (result_atom, job_result) at the end
  int form_timeout_ms = 60000;            ///< all ranks must have joined by then
  strategies::layout shape;               ///< the planner's layout for this generation
  std::string layout_json = "{}";         ///< the same, with the plan's figures, for events.jsonl
};

/// Pure decisions of the step protocol, tested without actors.
bool checkpoint_due(int64_t step, int64_t total_steps, int every);
bool evaluation_due(int64_t step, int64_t total_steps, int every);

/// Spawns the job supervisor. It stops itself after delivering the job_result.
caf::actor spawn_job_supervisor(caf::actor_system& sys, job_setup setup);

}  // namespace troupe::actors
