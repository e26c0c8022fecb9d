#pragma once
// The root of the supervisor tree: the actor around job_logic (actors/coordinator/job_logic.hpp).
// It turns messages, lost connections and clock ticks into the logic's events and carries out the
// actions it returns; every decision is the logic's.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "actors/coordinator/job_logic.hpp"
#include "actors/wire/messages.hpp"
#include "chaos/fault_spec.hpp"
#include "monitoring/event_log.hpp"
#include "monitoring/events/events.hpp"
#include "monitoring/metrics.hpp"
#include "monitoring/status_board.hpp"
#include "runtime/config.hpp"
#include "strategies/planner.hpp"
#include "strategies/replan.hpp"

namespace troupe::actors {

/// What the coordinator process hands its job_supervisor. The event log and the metrics
/// registry belong to the coordinator process and outlive the actor. Every setting of the job
/// is in `cfg`; the logic's parameters are derived from it (make_job_params).
struct job_setup {
  train_config cfg;
  std::string store_host;
  uint16_t store_port = 0;
  int64_t start_step = 0;  ///< steps already committed (resume)
  /// One rank's peak FLOP/s measured on this host (cfg.peak_flops, when set, wins): MFU.
  double peak_flops = 0;
  monitoring::event_log* events = nullptr;
  monitoring::metrics_registry* metrics = nullptr;
  /// Told every event the job emits, typed, on the supervisor's thread, before it is written.
  std::function<void(const events::job_event&)> on_event;
  caf::actor listener;                  ///< receives (result_atom, job_result) at the end
  int form_timeout_ms = 60000;          ///< every first member must have joined by then
  strategies::layout_plan plan;         ///< the planner's plan for the first generation
  std::chrono::milliseconds tick{100};  ///< how often deadlines are checked
  std::vector<chaos::fault> faults;     ///< injected when their step begins (same machine)
  std::vector<int64_t> skipped_steps;   ///< batches skipped by earlier sessions (resume)
  /// A standby coordinator (--etcd with several coordinators): the supervisor refuses members
  /// and agents as "not leading" until `(lead_atom, epoch, state_json)` makes it the leader.
  /// `state_json` is the job's state in etcd ({generation, committed_step, checkpoint_step});
  /// empty when no coordinator led the job before, which then forms as usual.
  bool standby = false;
  int64_t epoch = 0;  ///< the leadership epoch stamped on every message to members and agents
  /// With etcd: whether this coordinator still leads. Checked before any decision is carried
  /// out, so that a leader that wakes from a pause longer than its lease acts on nothing
  /// queued meanwhile (its election steps it down right after).
  std::function<bool()> still_leading;
  /// With etcd: asks etcd (briefly, blocking) whether this coordinator's leadership holds; a
  /// failed end of the job is carried out only then.
  std::function<bool()> confirm_leading;
  /// The job's status board (GET /status), owned by the coordinator process: the supervisor
  /// adds the rank table on each tick and each rank's step time. Null: none.
  monitoring::status_board* status = nullptr;
};

/// RUN_DIR/skipped_batches.json: the steps whose batch diverged and was skipped (one entry per
/// skip), which a resumed session must skip too. Written atomically after each rollback;
/// independent of checkpoints, so a resume from any of them replays the same batches.
std::vector<int64_t> load_skipped_batches(const std::string& run_dir);
void save_skipped_batches(const std::string& run_dir, const std::vector<int64_t>& steps);

/// Spawns the job supervisor. It stops itself after delivering the job_result.
caf::actor spawn_job_supervisor(caf::actor_system& sys, job_setup setup);

}  // namespace troupe::actors
