#pragma once
// What the job does about a slow rank (--straggler-policy): warn once per generation, evict
// it (a spare or a smaller layout takes over), or rebalance the micro-batches of a step away
// from its replica. The verdicts come from straggler_detector; this decides what follows.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/coordinator/job/job_actions.hpp"
#include "actors/coordinator/job/job_params.hpp"
#include "actors/coordinator/job/membership.hpp"
#include "actors/coordinator/straggler_detector.hpp"
#include "strategies/planner.hpp"

namespace troupe::actors {

/// Micro-batch counts per replica that balance the step across replicas of the speeds the
/// smoothed compute times `times` (by rank) show, each replica at the pace of its slowest
/// rank; the replicas of one expert group share their count. Empty when it cannot be done.
std::vector<int> rebalanced_micro_batches(const strategies::layout_plan& plan,
                                          const std::vector<double>& times);

class straggler_response {
 public:
  explicit straggler_response(const job_params& p);

  /// What a committed step's stragglers call for.
  struct verdict {
    enum class kind { none, evict, rebalance } what = kind::none;
    int rank = -1;      ///< the straggler
    double factor = 0;  ///< its score
  };
  /// A committed step's compute seconds by rank: each rank newly found slow is logged (once
  /// per generation); the policy then evicts it, or rebalances when that changes the counts
  /// (rebalanced() holds them for the next plan).
  verdict observe(const std::vector<double>& compute_s, const strategies::layout_plan& plan,
                  const membership& members, int64_t committed, actions& out);
  /// A new generation of `world` ranks: ranks are numbered anew.
  void new_generation(int world);

  /// The replicas' micro-batch counts the next plan must use, if a rebalance chose them.
  const std::optional<std::vector<int>>& rebalanced() const { return rebalanced_; }
  /// The next plan was made (with them or not).
  void forget_rebalance() { rebalanced_.reset(); }
  const std::vector<double>& scores() const { return detector_.scores(); }

 private:
  std::string policy_;
  straggler_detector detector_;
  std::vector<bool> flagged_;  // by rank: already reported this generation
  std::optional<std::vector<int>> rebalanced_;
};

}  // namespace troupe::actors
