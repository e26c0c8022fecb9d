#pragma once
// Expert load of an MoE job: adds up the ep groups' reports of each step, keeps the latest
// complete step's tokens per expert per block, and publishes it (events.jsonl, Prometheus).

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "actors/wire/messages.hpp"
#include "monitoring/event_log.hpp"
#include "monitoring/metrics.hpp"

namespace troupe::actors {

/// What an expert_group needs to know about its job.
struct expert_group_setup {
  int blocks = 0;   ///< MoE blocks (n_layer)
  int experts = 0;  ///< E
  int top_k = 1;
  int reports_per_step = 1;  ///< ep groups in the layout (dp / ep): one report each per step
  monitoring::event_log* events = nullptr;          ///< not owned; may be null
  monitoring::metrics_registry* metrics = nullptr;  ///< not owned; may be null
};

/// Sums the reports of each (generation, step) until all of that step's ep groups have
/// reported. A pure bookkeeping class, tested without actors.
class expert_load_tally {
 public:
  explicit expert_load_tally(const expert_group_setup& setup) : setup_(setup) {}

  /// Adds a report; returns the step's totals (rank -1) when it was the last one expected.
  /// Throws std::invalid_argument for a report of another shape. A step of a newer
  /// generation drops what is pending of older ones (their steps were not committed).
  std::optional<expert_load_report> add(const expert_load_report& r);

 private:
  expert_group_setup setup_;
  std::map<std::pair<uint64_t, int64_t>, std::pair<int, expert_load_report>> pending_;
};

/// Spawns the job's expert_group, linked to `parent` so it ends with it. It answers
/// get_atom with the latest complete step (an expert_load_report with rank -1; step -1
/// before the first) and takes expert_load_report messages (forwarded by the job supervisor).
/// Every complete step writes an `expert_load` event and updates troupe_expert_tokens_total
/// {block,expert}, troupe_expert_dropped_total{block} and troupe_expert_step_tokens{block,expert}.
caf::actor spawn_expert_group(caf::local_actor* parent, expert_group_setup setup);

}  // namespace troupe::actors
