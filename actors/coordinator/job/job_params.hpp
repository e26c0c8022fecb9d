#pragma once
// What the job's logic is started with: the validated config, the first plan, the bounds of
// an elastic job and the timeouts of its watchdogs.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/config.hpp"
#include "strategies/planner.hpp"
#include "strategies/replan.hpp"
#include "strategies/workload_description.hpp"

namespace troupe::actors {

/// What the job supervisor is started with.
struct job_params {
  train_config cfg;
  int64_t start_step = 0;        ///< steps already committed (resume)
  int64_t checkpoint_step = -1;  ///< the newest committed checkpoint (resume), -1 = none
  int members = 0;               ///< worker processes expected at the start (ranks + spares)
  int nodes = 1;                 ///< agents that share the first `members` (agent admission)
  strategies::layout_plan plan;  ///< the plan of the first generation
  strategies::elastic_bounds bounds;
  std::chrono::milliseconds form_timeout{60000};
  std::chrono::milliseconds heartbeat_timeout{2000};
  /// How long agents (launch_plan) and workers wait for a silent coordinator.
  std::chrono::milliseconds coordinator_timeout{10000};
  /// How long an agent cut off from every coordinator looks for the leader (launch_plan).
  std::chrono::milliseconds rejoin_timeout{600000};
  /// A clock tick this much later than the one before means the coordinator itself did not run
  /// (stopped, or its machine stalled): the members' silence over that gap is its own, so their
  /// heartbeat clocks restart instead of evicting them. 0 = never assumed (the logic's tests
  /// move their clock in jumps); make_job_params takes half the heartbeat timeout, since a
  /// member beats five times per timeout and a shorter gap cannot age a beat past it.
  std::chrono::milliseconds stall_gap{0};
  std::chrono::milliseconds settle{500};  ///< a failed vote waits this long for its root cause
  /// A member lost in the middle of training waits this long for the losses that come with it
  /// (schedule_regroup), which then make one new generation together. Negative: every loss
  /// begins its generation at once (the logic's unit tests); make_job_params sets 20 ms.
  std::chrono::milliseconds regroup_window{-1};
  std::string straggler_policy = "warn";  ///< warn | rebalance | evict
  double straggler_factor = 1.3;          ///< straggler_options::factor
  int max_failed_recoveries = 5;          ///< recoveries in a row without a committed step
  /// How long a recovery waits for workers that agents are restarting (a crash with restarts
  /// left), so they take their old places in one generation instead of a shrink and a grow.
  /// 0 = never wait. Only with max_restarts > 0.
  std::chrono::milliseconds replacement_wait{0};
  int max_restarts = 0;  ///< each agent's restart budget, as the agents are told
  /// Batches skipped after divergences in earlier sessions of this run (resume), one entry
  /// per skip: see reconfigure::skipped_steps.
  std::vector<int64_t> skipped_steps;
  /// A loss in the middle of training sends each member's place in the next generation with
  /// its abort, without waiting for state reports (see abort_generation::then).
  bool plan_with_abort = true;
  /// Such a plan for plain data parallelism on one host keeps the ranks' shared-memory group
  /// of before, shrunk to the ranks that are left, instead of connecting a new one (see
  /// reconfigure::shrink_kept).
  bool shrink_groups = true;
  /// What the job trains, as the coordinator sees it: its state table, its FLOPs per token,
  /// the layouts it can run (strategies/workload_description.hpp).
  strategies::workload_description workload;
  /// The workload's training FLOPs per token, and one rank's peak FLOP/s: the MFU estimate (0 =
  /// none).
  double flops_per_token = 0;
  double peak_flops = 0;
  /// Where the job's time accounting starts (the process that began the job started then);
  /// unset: when the logic is made.
  std::optional<std::chrono::steady_clock::time_point> accounted_from;
};

/// The job's parameters, derived from the validated config (`cfg`, with its paths resolved)
/// and the planner's first plan: the one place where a setting of the config becomes a
/// parameter of the logic. `start_step`: the checkpoint a resumed job starts from (0: none);
/// `skipped_steps`: the batches earlier sessions skipped (RUN_DIR/skipped_batches.json).
job_params make_job_params(const train_config& cfg, const strategies::layout_plan& plan,
                           int64_t start_step, std::vector<int64_t> skipped_steps);

}  // namespace troupe::actors
