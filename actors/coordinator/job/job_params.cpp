#include "actors/coordinator/job/job_params.hpp"

#include <utility>

#include "strategies/workload_description.hpp"

namespace troupe::actors {

job_params make_job_params(const train_config& cfg, const strategies::layout_plan& plan,
                           int64_t start_step, std::vector<int64_t> skipped_steps) {
  using std::chrono::milliseconds;
  job_params p;
  p.cfg = cfg;
  p.start_step = start_step;
  p.checkpoint_step = start_step > 0 ? start_step : -1;
  p.members = plan.shape.world() + cfg.elastic.spares;
  p.nodes = cfg.elastic.nodes;
  p.plan = plan;
  p.bounds.min_ranks = cfg.elastic.min_ranks;
  p.bounds.max_ranks = cfg.elastic.max_ranks > 0 ? cfg.elastic.max_ranks : cfg.world;
  const liveness_timeouts waits = liveness_of(cfg.elastic);
  p.heartbeat_timeout = waits.heartbeat;
  p.coordinator_timeout = waits.coordinator;
  p.rejoin_timeout = waits.rejoin;
  p.stall_gap = p.heartbeat_timeout / 2;
  // Long enough for the connections of a lost node (or of every node behind a lost switch) to
  // close together, short beside the heartbeat timeout that finds a silent member.
  p.regroup_window = milliseconds(20);
  p.form_timeout = milliseconds(cfg.elastic.join_timeout_ms);
  p.straggler_policy = cfg.elastic.straggler_policy;
  p.straggler_factor = cfg.elastic.straggler_factor;
  p.replacement_wait = milliseconds(cfg.elastic.replacement_wait_ms);
  p.max_restarts = cfg.elastic.max_restarts;
  p.skipped_steps = std::move(skipped_steps);
  p.workload = strategies::describe_workload(cfg);
  p.flops_per_token = p.workload.flops_per_count;
  p.peak_flops = cfg.peak_flops;  // 0: the supervisor measures it
  return p;
}

}  // namespace troupe::actors
