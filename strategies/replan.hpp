#pragma once
// Planning again when the world changes (elastic recovery): a plan for the ranks that are
// left or have joined, the plan as a value that travels to every rank (JSON both ways), and
// the division of a step's micro-batches among replicas of different speeds. Pure functions.

#include <string>
#include <vector>

#include "strategies/planner.hpp"

namespace troupe::strategies {

/// Bounds of an elastic job: never run on fewer than min_ranks, never use more than max_ranks.
struct elastic_bounds {
  int min_ranks = 1;
  int max_ranks = 0;  ///< 0 = no upper bound
};

/// A plan for `live` ranks after the world changed, given the previous generation's plan.
/// Keeps tp, pp and ep of `previous` and changes only dp when some dp >= 1 fits in
/// min(live, max_ranks) ranks (the rest are spares: plan.spares); otherwise plans tp, pp and
/// ep afresh (cost model of plan_layout, spares allowed). When dp does not divide the M
/// micro-batches, replicas take uneven counts (the first M % dp one more): dense models
/// only, each replica with at least pp of them; the global batch and the samples are the
/// same, so the model is too. Returns the reason when fewer than bounds.min_ranks ranks are
/// live or nothing fits. Never throws.
plan_result replan_layout(const layout_plan& previous, int live, const model_config& model,
                          const plan_constraints& c, const elastic_bounds& bounds);

/// Micro-batch counts for replicas of the given relative speeds (any positive scale):
/// proportional to speed, each at least `min_each`, summing to M (largest remainders, ties
/// to the lower index). Equal speeds give the even split. Empty when impossible (M <
/// replicas * min_each, a speed not finite and positive, no replicas).
std::vector<int> balance_micro_batches(int M, const std::vector<double>& replica_speed,
                                       int min_each);

/// Reads what to_json(layout_plan) wrote, or what it wrote before protocol 18 (the counts
/// listed per replica as "replica_micro_batches"). Throws std::invalid_argument naming the
/// field on malformed input (sizes below 1, counts that do not sum to M or do not match dp,
/// ...).
layout_plan plan_from_json(const std::string& text);

}  // namespace troupe::strategies
