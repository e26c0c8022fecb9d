#pragma once
// The coordinator's Prometheus metrics, registered once and updated from the job's event stream.

#include "actors/job/events.hpp"
#include "monitoring/metrics.hpp"

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
  monitoring::counter* stage_rejections;

  /// Registers every metric in `registry`, which must outlive this.
  explicit job_metrics(monitoring::metrics_registry& registry);

  /// Updates the metrics that `event` changes.
  void observe(const events::job_event& event);
};

}  // namespace troupe::actors
