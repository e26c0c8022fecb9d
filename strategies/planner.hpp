#pragma once
// The layout planner: picks a valid dp x tp x pp x ep layout for a world size, a model and
// a batch, or says which constraint rules every candidate out, as a pure function.
//
// Rules (each is rechecked by check_plan and named in a reason):
//  - tp divides model.n_head, the MLP width 4 * model.d_model and model.vocab (the
//    embedding and output head are split over tp by vocabulary rows).
//  - 1 <= pp <= model.n_layer; stage_layers splits the layers, the first n_layer % pp
//    stages taking one layer more.
//  - ep > 1 only for an MoE model, and ep divides model.experts and dp (see mesh.hpp). For
//    an MoE model ep also divides the micro-batch size batch / M, which the expert backend
//    runs, and micro_batch, the size of a validation batch.
//  - A step is M micro-batches: parallel.micro_batches when set, else batch / micro_batch;
//    M divides batch. M never depends on the world (so a shrunken world computes the same
//    step with more accumulation), and dp divides M so every replica runs m = M / dp whole
//    micro-batches (replica_micro_batches, all equal in a plan made here; a re-plan,
//    strategies/replan.hpp, may give the first M % dp replicas one more).
//  - pp > 1 needs m >= pp: fewer micro-batches than stages never fill the pipeline, and
//    the bubble (pp-1)/(m+pp-1) would exceed one half.
//  - With constraints.memory_bytes set, the estimated weights, gradients and AdamW state
//    of the fullest rank fit in it.
//
// Cost model (free choice): the estimated seconds of one step,
//   compute / (1 - bubble) + dp/edp gradient all-reduce + tp activation all-reduces
//   + pp activation send/recv + ep token all-to-all,
// each collective priced as latency_s plus its ring volume over the intra-node bandwidth
// when its group lies on one node of constraints.ranks_per_node, else over the inter-node
// bandwidth (an alpha-beta model). Small models therefore end up data-parallel (one
// gradient all-reduce per step against 4 tp all-reduces per layer and micro-batch), and model
// parallelism is chosen when the batch cannot feed every rank or memory demands it. Free
// tp is kept to divisors of ranks_per_node, so a tensor-parallel group never leaves a
// node. Ties go to the smaller tp * pp, then smaller pp, tp, ep.
//
// An explicit M is the user's word (not a validity rule, so check_plan does not apply it):
// when parallel.micro_batches is set (> 0) and tp and pp are both free, a dense model is
// planned as pure data parallelism of the world, never with tp or pp raised only so that dp
// divides M or so that the batch feeds every rank; that would change the user's layout
// behind their back. Free tp/pp are still chosen as before when pure dp of the world would
// divide M (then the cost model decides) or would break constraints.memory_bytes (memory
// demands model parallelism). When neither holds, the reason names parallel.micro_batches
// (--micro-batches) and the world and suggests an M that fits; with allow_spares the
// largest smaller world that fits under the same rule is used instead. MoE models run over
// dp x ep only, so the rule changes nothing for them.
//
// Estimates (cost and memory) need finite positive flops_per_s and bandwidths, latency_s
// >= 0 and a finite memory_bytes >= 0; other values are refused with a reason.
//
// The plan travels from the coordinator to every rank as to_json's text, read back by
// plan_from_json (strategies/replan.hpp); to_json writes every double with the fewest digits
// that read back to the same value, so the round trip gives a plan == the original.

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runtime/config.hpp"
#include "strategies/mesh.hpp"

namespace troupe::strategies {

/// A half-open range of transformer layers [first, last).
struct layer_range {
  int first = 0;
  int last = 0;
  int size() const { return last - first; }
  friend bool operator==(const layer_range&, const layer_range&) = default;
};

/// The layers of each of `pp` stages: consecutive, covering [0, n_layer), sizes differing by
/// at most one, the first n_layer % pp stages taking the extra layer. Throws
/// std::invalid_argument unless 1 <= pp <= n_layer.
std::vector<layer_range> stage_layers(int n_layer, int pp);

/// The idle fraction of a pipeline of `pp` stages running `m` micro-batches (GPipe and
/// 1F1B alike): (pp - 1) / (m + pp - 1). 0 when pp == 1.
double pipeline_bubble(int pp, int m);

/// What the planner must respect besides the model. 0 in tp/pp/ep means "choose".
struct plan_constraints {
  int batch = 16;             ///< global batch, sequences per step
  int micro_batch = 4;        ///< sequences per micro-batch (when micro_batches == 0)
  int micro_batches = 0;      ///< micro-batches per step M; 0 = batch / micro_batch
  int tp = 0;                 ///< fixed tensor-parallel size, 0 = free
  int pp = 0;                 ///< fixed pipeline size, 0 = free
  int ep = 0;                 ///< fixed expert-parallel size, 0 = free
  int zero = 0;               ///< 1 = AdamW state sharded over dp (memory estimate only)
  int ranks_per_node = 8;     ///< ranks sharing one fast interconnect
  double memory_bytes = 0;    ///< per-rank budget for weights+grads+AdamW; 0 = unlimited
  double flops_per_s = 1e12;  ///< sustained throughput of one rank
  double intra_node_bytes_per_s = 100e9;   ///< bandwidth inside a node
  double inter_node_bytes_per_s = 12.5e9;  ///< bandwidth between nodes
  double latency_s = 10e-6;                ///< fixed cost of one collective call or send
  bool allow_spares = false;               ///< when the whole world fits no layout, use fewer ranks
  /// The exact reduction's gradient copies count in the memory estimate (where the layout
  /// has no experts; runtime/comm/tree_sum.hpp: exact_sum_buffers).
  bool exact_reduction = false;
  std::string order{default_rank_order};  ///< rank order of the planned layout
};

/// The constraints a job's config implies: batch, micro-batching, zero, and tp/pp/ep
/// fixed where the config sets them above 1 (1 is the config's default, so it means free).
plan_constraints constraints_from(const train_config& cfg);

/// A valid layout with everything derived from it.
struct layout_plan {
  layout shape;
  /// Ranks of the world left idle (allow_spares only): the plan numbers ranks
  /// 0..shape.world()-1 and the caller chooses which live ranks sit out.
  int spares = 0;
  std::vector<layer_range> stages;    ///< layers of each pipeline stage
  int micro_batches = 0;              ///< M: micro-batches per step, whole world
  int micro_batch_size = 0;           ///< sequences per micro-batch: batch / M
  int micro_batches_per_replica = 0;  ///< m = M / dp (the largest count when uneven)
  /// Micro-batches of each dp replica, summing to M; replica r runs those after the replicas
  /// before it. Even in a first plan; a re-plan (strategies/replan.hpp) may divide unevenly.
  std::vector<int> replica_micro_batches;
  double bubble = 0;           ///< pipeline_bubble(pp, m)
  double params_per_rank = 0;  ///< parameters held by the fullest rank
  double memory_bytes = 0;     ///< its weights + gradients + AdamW state, estimated
  double step_seconds = 0;     ///< the cost model's estimate of one step
  /// Every field equal, doubles exactly (to_json's text reads back exactly).
  friend bool operator==(const layout_plan&, const layout_plan&) = default;
};

/// Either a plan or the reason none exists (naming the constraint and a fix).
using plan_result = std::variant<layout_plan, std::string>;

/// Plans a layout of exactly `world` ranks (or fewer with allow_spares). Honours fixed
/// tp/pp/ep; otherwise picks the cheapest valid layout by the cost model above. Never
/// throws for any input; deterministic.
plan_result plan_layout(int world, const model_config& model, const plan_constraints& c);

/// plan_layout(world, cfg.model, constraints_from(cfg)). `world` is separate from
/// cfg.world because elastic recovery plans for the ranks that are left.
plan_result plan_layout(int world, const train_config& cfg);

/// Why `l` breaks a rule above for this model and these constraints (fixed tp/pp/ep
/// included), or an empty string when it breaks none. Every reason names the config
/// field involved.
std::string check_plan(const layout& l, const model_config& model, const plan_constraints& c);

/// The plan for a layout that check_plan accepts (cost fields filled in). Throws
/// std::invalid_argument with check_plan's reason otherwise.
layout_plan make_plan(const layout& l, const model_config& model, const plan_constraints& c);

/// The plan as a JSON object, for the reconfigure message that carries it to every rank: the
/// layout, spares, stages, micro-batching, bubble and estimates. Each replica's micro-batch
/// count is written as runs of equal counts ("replica_micro_batch_runs": [[replicas, count],
/// ...]), so an even plan's text does not grow with dp. Doubles are written in the shortest
/// form that reads back to the same value (null when not finite), so
/// plan_from_json(to_json(p)) == p.
std::string to_json(const layout_plan& p);

/// The plan as events.jsonl shows it (job_start's "layout", each generation's "plan"): the
/// object to_json writes, as a JSON value that dumps to the same numbers, with the counts
/// listed one per replica ("replica_micro_batches", as readers of the events expect) instead
/// of as runs, and the layout's name ("describe") and the ZeRO stage ("zero") added.
nlohmann::json plan_doc(const layout_plan& p, int zero);

/// Whether the result holds a plan, and accessors that read better than std::get.
inline bool has_plan(const plan_result& r) { return std::holds_alternative<layout_plan>(r); }
inline const layout_plan& plan_of(const plan_result& r) { return std::get<layout_plan>(r); }
inline const std::string& reason_of(const plan_result& r) { return std::get<std::string>(r); }

}  // namespace troupe::strategies
