#pragma once
// The coordinator's Prometheus metrics, registered once and updated from the job's event stream.

#include <map>
#include <string>
#include <vector>

#include "monitoring/events/events.hpp"
#include "monitoring/metrics.hpp"

namespace troupe {
struct model_config;
}

namespace troupe::actors {

/// The metrics the coordinator exports, kept up to date from the event stream alone
/// (events.jsonl's lines, as monitoring::event_log hands them to its listener).
struct job_metrics {
  monitoring::counter* steps;
  monitoring::counter* tokens;
  monitoring::counter* checkpoints;
  monitoring::counter* ranks_lost;
  monitoring::counter* stale;
  monitoring::counter_family* recoveries;
  monitoring::gauge* loss;
  monitoring::gauge* val_loss;
  monitoring::gauge* tokens_per_s;
  monitoring::gauge* world;
  monitoring::gauge* generation;
  monitoring::gauge* state;
  monitoring::gauge* step;
  monitoring::gauge* last_step_time;
  monitoring::gauge* exit_code;
  monitoring::gauge* lr;
  monitoring::gauge* compute_s;
  monitoring::gauge* comm_s;
  monitoring::gauge* control_s;
  monitoring::gauge_family* heartbeat_age;
  monitoring::gauge_family* straggler_score;
  monitoring::histogram* step_seconds;
  monitoring::histogram* recovery_seconds;
  monitoring::histogram* ckpt_stall;
  monitoring::histogram* ckpt_write;
  monitoring::counter* ckpt_bytes_written;
  monitoring::counter* ckpt_bytes_deduplicated;
  monitoring::counter* ckpt_failures;
  monitoring::gauge* ckpt_last_step;
  monitoring::gauge* ckpt_snapshot_bytes;
  monitoring::counter* divergences;
  monitoring::counter* rollbacks;
  monitoring::counter* etcd_state_lost;
  monitoring::counter* stage_rejections;
  monitoring::counter* relayed_votes;        // votes that came in a node relay's bundle (--relay)
  monitoring::counter_family* rank_seconds;  // by phase (actors/coordinator/job/goodput.hpp)
  monitoring::gauge* goodput;
  monitoring::gauge* mfu_ratio;
  monitoring::gauge* mfu;  // troupe_mfu, the old name of troupe_mfu_ratio: kept one release
  monitoring::gauge* peak_flops;
  monitoring::gauge_family* job_info;

  /// Registers every metric in `registry`, which must outlive this.
  explicit job_metrics(monitoring::metrics_registry& registry);

  /// Updates the metrics that `event` changes.
  void observe(const events::job_event& event);

  /// Names the job in troupe_job_info (the one series replaces any earlier one). `model` and
  /// `layout` are short descriptions (model_words, strategies::describe).
  void set_job_info(const std::string& job_id, const std::string& run_dir, const std::string& model,
                    const std::string& layout);

  /// The per-rank gauges (heartbeat age, straggler score) for a generation of ages.size()
  /// ranks: labelled by rank up to `max_rank_labels` ranks, and above that by node (the
  /// node's worst rank), so a large job's label set stays bounded. NaN scores are left out.
  void set_rank_gauges(const std::vector<double>& ages, const std::vector<double>& scores,
                       const std::vector<int>& node_of_rank, int max_rank_labels);

 private:
  // Adds the rank-seconds of `phases` (a step's) or brings the counters up to `phases`
  // (the goodput event's totals, which include the steps already added).
  void add_phases(const nlohmann::json& phases, bool totals);
  void set_mfu(double value);  // under both names
  std::map<std::string, double> phase_counted_;
};

/// The model's shape as troupe_job_info's `model` label: its config keys and values, such as
/// "n_layer=4 n_head=4 d_model=128 context=64 vocab=256" (experts and top_k added for MoE).
std::string model_words(const model_config& m);

/// The compiler that built this binary, as troupe_build_info's `compiler` label ("gcc-12.2.0").
std::string compiler_words();

}  // namespace troupe::actors
