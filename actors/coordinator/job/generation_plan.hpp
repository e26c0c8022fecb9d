#pragma once
// Each generation's layout and how it forms: the plan for the members that are left (or have
// joined), where each rank's state comes from, the reconfigure every member gets, and the
// record of the recovery that forms it (why, since when, what caused it, how many in a row
// failed, whether its groups could not connect for the same reason twice). The generation
// number itself is membership's. A pure state machine.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/coordinator/job/job_actions.hpp"
#include "actors/coordinator/job/job_params.hpp"
#include "actors/coordinator/job/membership.hpp"
#include "actors/coordinator/restore_plan.hpp"
#include "monitoring/events/events.hpp"
#include "strategies/planner.hpp"
#include "strategies/replan.hpp"

namespace troupe::actors {

/// Plans a layout for a number of live members, as the job's model, config and elastic
/// bounds allow (strategies::replan_layout).
struct replanner {
  explicit replanner(const job_params& p);
  strategies::plan_result operator()(const strategies::layout_plan& previous, int live) const;
  /// The ranks such a plan uses, 0 when none fits.
  int world_for(const strategies::layout_plan& previous, int live) const;

  model_config model;
  strategies::plan_constraints constraints;
  strategies::elastic_bounds bounds;
};

class generation_plan {
 public:
  explicit generation_plan(const job_params& p);

  /// The current generation's plan.
  const strategies::layout_plan& plan() const { return plan_; }
  int world() const { return plan_.shape.world(); }
  /// Where each rank of the current generation got its state.
  const restore_plan& restore() const { return restore_; }
  /// Whether the current generation's ranks run on one host (reconfigure::one_host).
  bool one_host() const { return one_host_; }

  // The recovery being made.
  /// A recovery begins (one already under way keeps the reason and start it had).
  void begin_recovery(const std::string& reason, logic_time now);
  const std::string& reason() const { return reason_; }
  /// What caused the recovery (the generation event's `cause`): the first one named wins...
  void note_cause(const std::string& cause) {
    if (cause_.empty()) cause_ = cause;
  }
  /// ...unless the recovery is the job's own choice (a grow, a rebalance, a rollback).
  void set_cause(const std::string& cause) { cause_ = cause; }
  /// Counts one more recovery without a committed step; whether that is more than `max`.
  bool too_many_recoveries(int max) { return ++failed_in_row_ > max; }
  /// A committed step: the recoveries before it succeeded.
  void step_committed() { failed_in_row_ = 0; }

  /// The layout of generation `generation` for `live` members: the first generation keeps the
  /// plan it was started with; later ones plan again, with the micro-batch counts a rebalance
  /// chose when the shape stays the same. The reason when no layout fits.
  strategies::plan_result next(uint64_t generation, int live,
                               const std::optional<std::vector<int>>& rebalanced) const;
  /// Generation `generation` uses `next`: chooses the member of each rank and where its state
  /// comes from, given what the live members hold (restore_plan.hpp).
  /// Takeover: generation `generation` of the job ran `plan` under an earlier coordinator;
  /// members may hold state in its layout, and the next plan starts from it.
  void take_over(uint64_t generation, const strategies::layout_plan& plan) {
    plans_[generation] = plan;
    plan_ = plan;
  }
  void adopt(uint64_t generation, const strategies::layout_plan& next,
             const std::vector<member_info>& live, int64_t restore_step, int64_t checkpoint_step);
  /// Each live member's reconfigure for the generation just adopted (members are placed).
  void reconfigures(const membership& members, const std::vector<int64_t>& skipped, actions& out);
  /// A generation opens: nobody has reconfigured for it, and it is not planned yet.
  void new_generation() {
    restored_.clear();
    planned_ahead(false, false);
  }
  /// How the generation was planned: with the aborts (no report round), shrinking the group
  /// of the generation before.
  void planned_ahead(bool with_abort, bool shrunk) {
    planned_with_abort_ = with_abort;
    shrunk_ = shrunk;
  }

  /// A member of rank `r.rank` (-1: a spare) finished reconfiguring.
  void record_restored(const reconfigured& r);
  /// A member could not join the generation being formed. When its group could not connect
  /// for the same class of reason (reconfigured::error_cause) as in the generation before,
  /// which that failure opened, a retry would fail the same way again: returns why the job
  /// ends. Logs each connect failure.
  std::optional<std::string> connect_failure(const reconfigured& r, actions& out);
  /// Every member is in: logs where each rank's state came from (a `restored` event each, or
  /// for more ranks than metrics_rank_labels one `restored_summary`), the generation, and (the
  /// first time) that training started at `committed`.
  void formed(uint64_t generation, int spares, int64_t committed, logic_time now, actions& out);

 private:
  // The last generation that could not form because a group could not connect.
  struct connect_failure_seen {
    uint64_t generation = 0;
    std::string cause;    // its class: refused, unreachable, timed-out, signature, loopback
    std::string address;  // the peer address it concerns
  };

  replanner replan_;
  train_config reduction_cfg_;  // what decides the reduction in effect (training_started)
  int zero_ = 0;
  int rank_labels_ = 64;  // the most ranks that log a restored event each
  strategies::layout_plan plan_;
  std::map<uint64_t, strategies::layout_plan> plans_;  // generation -> plan, for held state
  restore_plan restore_;
  std::map<int32_t, reconfigured> restored_;  // by rank
  bool one_host_ = false;
  events::transport transport_;  // the current generation's, from its reconfigures
  bool planned_with_abort_ = false;
  bool shrunk_ = false;
  bool training_announced_ = false;  // training_started was logged
  // the recovery
  logic_time started_{};
  std::string reason_;
  std::string cause_;
  int failed_in_row_ = 0;
  std::optional<connect_failure_seen> connect_failed_;
};

}  // namespace troupe::actors
