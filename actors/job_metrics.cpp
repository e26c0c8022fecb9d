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

void job_metrics::observe(const events::job_event& event) {
  using namespace events;
  std::visit(overloaded{
                 [this](const events::step& e) {
                   steps->inc();
                   tokens->inc(static_cast<double>(e.tokens));
                   loss->set(e.loss);
                   tokens_per_s->set(e.tokens_per_s);
                   step->set(static_cast<double>(e.step));
                   lr->set(e.lr);
                   compute_s->set(e.compute_s);
                   comm_s->set(e.comm_s);
                   control_s->set(e.control_s);
                   step_seconds->observe(e.step_s);
                 },
                 [this](const events::state& e) { state->set(e.value); },
                 [this](const events::generation& e) {
                   world->set(e.world);
                   generation->set(static_cast<double>(e.number));
                   step->set(static_cast<double>(e.start_step));
                   if (e.number > 1 && e.cause != "grow" && e.cause != "rebalance") {
                     recoveries->with({{"cause", e.cause}}).inc();
                     recovery_seconds->observe(e.recovery_s);
                   }
                 },
                 [this](const rank_lost&) { ranks_lost->inc(); },
                 [this](const stale_message&) { stale->inc(); },
                 [this](const events::checkpoint& e) {
                   checkpoints->inc();
                   ckpt_stall->observe(e.stall_s);
                   ckpt_write->observe(e.write_s);
                   ckpt_bytes_written->inc(static_cast<double>(e.bytes_written));
                   ckpt_bytes_deduplicated->inc(static_cast<double>(e.bytes_deduplicated));
                   ckpt_last_step->set(static_cast<double>(e.step));
                   ckpt_snapshot_bytes->set(static_cast<double>(e.snapshot_buffer_bytes));
                 },
                 [this](const checkpoint_failed&) { ckpt_failures->inc(); },
                 [this](const diverged& e) {
                   divergences->inc();
                   if (e.action == "rollback") rollbacks->inc();
                 },
                 [this](const validation& e) { val_loss->set(e.val_loss); },
                 [](const auto&) {},
             },
             event);
}

}  // namespace troupe::actors
