#include "actors/coordinator/job/straggler_response.hpp"

#include <algorithm>
#include <cmath>

#include "strategies/mesh.hpp"
#include "strategies/replan.hpp"

namespace troupe::actors {

std::vector<int> rebalanced_micro_batches(const strategies::layout_plan& plan,
                                          const std::vector<double>& times) {
  // A replica's speed: micro-batches per second of (smoothed) compute, its slowest rank
  // setting the pace; a second rebalance so starts from the counts the first one gave.
  std::vector<double> speed(static_cast<size_t>(plan.shape.dp), 1e300);
  for (int rank = 0; rank < plan.shape.world(); ++rank) {
    const auto at = strategies::coords_of(plan.shape, rank);
    const auto d = static_cast<size_t>(at.dp);
    const double t =
        static_cast<size_t>(rank) < times.size() ? times[static_cast<size_t>(rank)] : std::nan("");
    const double count =
        d < plan.replica_micro_batches.size() ? plan.replica_micro_batches[d] : 1.0;
    if (std::isfinite(t) && t > 0) speed[d] = std::min(speed[d], count / t);
  }
  for (auto& x : speed)
    if (x >= 1e300) x = 0;  // no reports: balance_micro_batches refuses, nothing changes
  // The replicas of one ep group (dp = ep + ep_size * edp) share every micro-batch, so they
  // run equally many: balance the groups, each at the pace of its slowest replica, and give
  // every replica of a group the group's count. With ep = 1 a group is one replica.
  const auto ep = static_cast<size_t>(std::max(1, plan.shape.ep));
  std::vector<double> group_speed(speed.size() / ep, 1e300);
  for (size_t d = 0; d < speed.size(); ++d)
    group_speed[d / ep] = std::min(group_speed[d / ep], speed[d]);
  const auto group_counts = strategies::balance_micro_batches(
      plan.micro_batches / static_cast<int>(ep), group_speed, std::max(1, plan.shape.pp));
  std::vector<int> counts;
  for (size_t d = 0; d < speed.size() && !group_counts.empty(); ++d)
    counts.push_back(group_counts[d / ep]);
  return counts;
}

straggler_response::straggler_response(const job_params& p)
    : policy_(p.straggler_policy), detector_(straggler_options{.factor = p.straggler_factor}) {}

straggler_response::verdict straggler_response::observe(const std::vector<double>& compute_s,
                                                        const strategies::layout_plan& plan,
                                                        const membership& members,
                                                        int64_t committed, actions& out) {
  for (const auto& v : detector_.observe(compute_s)) {
    const auto r = static_cast<size_t>(v.rank);
    if (r >= flagged_.size() || flagged_[r]) continue;
    flagged_[r] = true;
    out.push_back(emit_event{events::straggler{.rank = v.rank,
                                               .member = members.member_of_rank(v.rank),
                                               .factor = v.factor,
                                               .generation = members.generation(),
                                               .step = committed,
                                               .policy = policy_}});
    if (policy_ == "evict") return {verdict::kind::evict, v.rank, v.factor};
    if (policy_ == "rebalance" && plan.shape.dp > 1) {
      // Replica speeds from the smoothed scores of their ranks; the global batch and the
      // math stay the same.
      auto counts = rebalanced_micro_batches(plan, detector_.smoothed());
      if (!counts.empty() && counts != plan.replica_micro_batches) {
        rebalanced_ = std::move(counts);
        return {verdict::kind::rebalance, v.rank, v.factor};
      }
    }
  }
  return {};
}

void straggler_response::new_generation(int world) {
  detector_.reset();
  flagged_.assign(static_cast<size_t>(world), false);
}

}  // namespace troupe::actors
