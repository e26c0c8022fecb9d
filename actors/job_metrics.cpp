// job_metrics: the coordinator's metrics and how each event moves them.
#include "actors/job_metrics.hpp"

#include <string>

#include "actors/tls_transport.hpp"

namespace troupe::actors {

job_metrics::job_metrics(monitoring::metrics_registry& r)
    : steps(&r.add_counter("troupe_steps_total", "Training steps committed")),
      tokens(&r.add_counter("troupe_tokens_total", "Tokens trained on in committed steps")),
      checkpoints(&r.add_counter("troupe_checkpoints_total", "Checkpoints committed")),
      ranks_lost(
          &r.add_counter("troupe_ranks_lost_total", "Ranks that died or were declared lost")),
      stale(&r.add_counter("troupe_stale_messages_total",
                           "Messages of an older generation, dropped")),
      recoveries(&r.add_counter_family("troupe_recoveries_total",
                                       "Generations opened to recover, by cause")),
      loss(&r.add_gauge("troupe_loss", "Training loss of the last committed step (nats per byte)")),
      val_loss(&r.add_gauge("troupe_validation_loss", "Last validation loss (nats per byte)")),
      tokens_per_s(
          &r.add_gauge("troupe_tokens_per_second", "Training throughput of the last step")),
      world(&r.add_gauge("troupe_world_size", "Ranks in the current generation")),
      generation(&r.add_gauge("troupe_generation", "Current generation of the job")),
      state(&r.add_gauge("troupe_job_state",
                         "Job state: 0 forming, 1 training, 2 recovering, 3 done, 4 failed")),
      step(&r.add_gauge("troupe_step", "Last committed step")),
      lr(&r.add_gauge("troupe_learning_rate", "Learning rate of the last committed step")),
      compute_s(&r.add_gauge("troupe_step_compute_seconds",
                             "Mean forward+backward time per rank, last step")),
      comm_s(&r.add_gauge("troupe_step_comm_seconds",
                          "Mean gradient all-reduce time per rank, last step")),
      control_s(&r.add_gauge("troupe_step_control_seconds",
                             "Mean wait for the commit per rank, last step")),
      heartbeat_age(&r.add_gauge_family("troupe_heartbeat_age_seconds",
                                        "Seconds since each rank's last heartbeat")),
      straggler_score(&r.add_gauge_family(
          "troupe_straggler_score", "Each rank's smoothed compute time over the median rank's")),
      step_seconds(&r.add_histogram("troupe_step_seconds", "Wall time between commits",
                                    monitoring::exponential_buckets(0.005, 2, 14))),
      recovery_seconds(&r.add_histogram(
          "troupe_recovery_seconds", "From the failure's detection to the new generation training",
          monitoring::exponential_buckets(0.01, 2, 14))),
      ckpt_stall(&r.add_histogram("troupe_checkpoint_stall_seconds",
                                  "Training held per checkpoint (the slowest rank's snapshot)",
                                  monitoring::exponential_buckets(0.0001, 2, 18))),
      ckpt_write(&r.add_histogram("troupe_checkpoint_write_seconds",
                                  "Background write of a checkpoint (the slowest rank's)",
                                  monitoring::exponential_buckets(0.001, 2, 16))),
      ckpt_bytes_written(&r.add_counter("troupe_checkpoint_bytes_written_total",
                                        "Checkpoint chunk bytes written to storage")),
      ckpt_bytes_deduplicated(
          &r.add_counter("troupe_checkpoint_bytes_deduplicated_total",
                         "Checkpoint chunk bytes already stored, so not written again")),
      ckpt_failures(&r.add_counter("troupe_checkpoint_failures_total",
                                   "Checkpoints that failed to save or commit")),
      ckpt_last_step(&r.add_gauge("troupe_checkpoint_last_committed_step",
                                  "Step of the newest committed checkpoint")),
      ckpt_snapshot_bytes(&r.add_gauge("troupe_checkpoint_snapshot_buffer_bytes",
                                       "Memory held by the ranks' snapshot buffers, summed")),
      divergences(&r.add_counter("troupe_divergences_total",
                                 "Steps that diverged (non-finite loss or gradient norm, or a "
                                 "negative loss) and were not committed")),
      rollbacks(&r.add_counter("troupe_divergence_rollbacks_total",
                               "Rollbacks to the last committed checkpoint after a divergence")),
      stage_rejections(
          &r.add_counter_family("troupe_rejected_connections_total", rejected_connections_help)
               .with({{"listener", "stage"}})) {}

void job_metrics::observe(const nlohmann::json& e) {
  const std::string what = e.value("event", "");
  if (what == "step") {
    steps->inc();
    tokens->inc(e.value("tokens", 0.0));
    loss->set(e.value("loss", 0.0));
    tokens_per_s->set(e.value("tokens_per_s", 0.0));
    step->set(e.value("step", 0.0));
    lr->set(e.value("lr", 0.0));
    compute_s->set(e.value("compute_s", 0.0));
    comm_s->set(e.value("comm_s", 0.0));
    control_s->set(e.value("control_s", 0.0));
    step_seconds->observe(e.value("step_s", 0.0));
  } else if (what == "state") {
    state->set(e.value("value", 0.0));
  } else if (what == "generation") {
    world->set(e.value("world", 0.0));
    generation->set(e.value("number", 0.0));
    step->set(e.value("start_step", 0.0));
    const std::string cause = e.value("cause", std::string());
    if (e.value("number", 0) > 1 && cause != "grow" && cause != "rebalance") {
      recoveries->with({{"cause", e.value("cause", std::string("other"))}}).inc();
      recovery_seconds->observe(e.value("recovery_s", 0.0));
    }
  } else if (what == "rank_lost") {
    ranks_lost->inc();
  } else if (what == "stale_message") {
    stale->inc();
  } else if (what == "checkpoint") {
    checkpoints->inc();
    ckpt_stall->observe(e.value("stall_s", 0.0));
    ckpt_write->observe(e.value("write_s", 0.0));
    ckpt_bytes_written->inc(e.value("bytes_written", 0.0));
    ckpt_bytes_deduplicated->inc(e.value("bytes_deduplicated", 0.0));
    ckpt_last_step->set(e.value("step", 0.0));
    ckpt_snapshot_bytes->set(e.value("snapshot_buffer_bytes", 0.0));
  } else if (what == "checkpoint_failed") {
    ckpt_failures->inc();
  } else if (what == "diverged") {
    divergences->inc();
    if (e.value("action", std::string()) == "rollback") rollbacks->inc();
  } else if (what == "validation") {
    val_loss->set(e.value("val_loss", 0.0));
  }
}

}  // namespace troupe::actors
