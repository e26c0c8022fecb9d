// job_metrics: the coordinator's metrics and how each event moves them.
#include "actors/coordinator/job_metrics.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>

#include "actors/coordinator/job/goodput.hpp"
#include "actors/wire/tls_transport.hpp"
#include "runtime/config.hpp"

namespace troupe::actors {

namespace {
double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

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
      last_step_time(&r.add_gauge("troupe_last_step_timestamp_seconds",
                                  "Unix time of the last committed step (before the first: "
                                  "when this coordinator began leading the job)")),
      exit_code(&r.add_gauge("troupe_job_exit_code",
                             "The job's exit code once it ended (0 done, 1 failed, 3 diverged, "
                             "4 checkpoint failed, 75 stopped to be requeued, 76 another "
                             "coordinator leads, 130 interrupted); -1 while it runs")),
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
      etcd_state_lost(&r.add_counter(
          "troupe_etcd_state_lost_total",
          "Takeovers that found no state of this run in etcd (deleted, lost, unreadable or "
          "another run's) and took the job over from the run directory and the members")),
      stage_rejections(
          &r.add_counter_family("troupe_rejected_connections_total", rejected_connections_help)
               .with({{"listener", "stage"}})),
      relayed_votes(&r.add_counter("troupe_relayed_votes_total",
                                   "Votes that came bundled by the nodes' relays (--relay)")),
      rank_seconds(&r.add_counter_family(
          "troupe_rank_seconds_total",
          "Rank-seconds of the job by phase; the phases sum to wall time x rank slots")),
      goodput(&r.add_gauge("troupe_goodput_ratio",
                           "Useful compute over all rank-seconds of the job so far, as of the "
                           "last commit, generation change or end")),
      mfu_ratio(&r.add_gauge("troupe_mfu_ratio",
                             "Model FLOPs utilisation of the job so far, as of the last commit, "
                             "generation change or end: committed tokens' training FLOPs over "
                             "peak FLOP/s x all rank-seconds")),
      mfu(&r.add_gauge("troupe_mfu", "Deprecated: use troupe_mfu_ratio (the same value)")),
      peak_flops(
          &r.add_gauge("troupe_peak_flops", "One rank's peak FLOP/s the MFU is measured against")),
      job_info(&r.add_gauge_family(
          "troupe_job_info", "Always 1: the job's id, run directory, model and first layout")) {
  // A stall is judged by the time since the last commit, and the job has not ended yet.
  last_step_time->set(unix_seconds_now());
  exit_code->set(-1);
  r.add_gauge_family("troupe_build_info", "Always 1: the troupe version and compiler")
      .with({{"version", TROUPE_VERSION}, {"compiler", compiler_words()}})
      .set(1);
  // The causes a recovery can have are exported at 0 from the start, so that the first
  // recovery of each is an increase a rate() sees.
  for (const char* cause : {"exit", "connection", "hang", "straggler", "error", "divergence"})
    recoveries->with({{"cause", cause}});
  // Every phase is exported from the first scrape, at 0 until time is spent in it.
  for (int p = 0; p < phase_count; ++p)
    rank_seconds->with({{"phase", std::string(phase_name(static_cast<phase>(p)))}});
}

void job_metrics::set_rank_gauges(const std::vector<double>& ages,
                                  const std::vector<double>& scores,
                                  const std::vector<int>& node_of_rank, int max_rank_labels) {
  // Only the current generation's ranks (or nodes) are exported: a rank lost in a shrink, or
  // an evicted straggler, must not go on showing its last value.
  std::vector<monitoring::label_set> age_series, score_series;
  const bool by_rank = static_cast<int>(std::max(ages.size(), scores.size())) <= max_rank_labels;
  if (by_rank) {
    for (size_t r = 0; r < ages.size(); ++r) {
      age_series.push_back({{"rank", std::to_string(r)}});
      heartbeat_age->with(age_series.back()).set(ages[r]);
    }
    for (size_t r = 0; r < scores.size(); ++r)
      if (std::isfinite(scores[r])) {
        score_series.push_back({{"rank", std::to_string(r)}});
        straggler_score->with(score_series.back()).set(scores[r]);
      }
    heartbeat_age->retain_only(age_series);
    straggler_score->retain_only(score_series);
    return;
  }
  auto node = [&](size_t r) { return r < node_of_rank.size() ? node_of_rank[r] : 0; };
  std::map<int, double> worst_age, worst_score;
  for (size_t r = 0; r < ages.size(); ++r) {
    double& a = worst_age.try_emplace(node(r), ages[r]).first->second;
    a = std::max(a, ages[r]);
  }
  for (size_t r = 0; r < scores.size(); ++r) {
    if (!std::isfinite(scores[r])) continue;
    double& s = worst_score.try_emplace(node(r), scores[r]).first->second;
    s = std::max(s, scores[r]);
  }
  for (const auto& [n, a] : worst_age) {
    age_series.push_back({{"node", std::to_string(n)}});
    heartbeat_age->with(age_series.back()).set(a);
  }
  for (const auto& [n, s] : worst_score) {
    score_series.push_back({{"node", std::to_string(n)}});
    straggler_score->with(score_series.back()).set(s);
  }
  heartbeat_age->retain_only(age_series);
  straggler_score->retain_only(score_series);
}

void job_metrics::add_phases(const nlohmann::json& phases, bool totals) {
  if (!phases.is_object()) return;
  for (const auto& [name, value] : phases.items()) {
    if (!value.is_number()) continue;
    double& counted = phase_counted_[name];
    const double add = totals ? value.get<double>() - counted : value.get<double>();
    if (add <= 0) continue;
    rank_seconds->with({{"phase", name}}).inc(add);
    counted += add;
  }
}

void job_metrics::set_mfu(double value) {
  mfu_ratio->set(value);
  mfu->set(value);
}

void job_metrics::set_job_info(const std::string& job_id, const std::string& run_dir,
                               const std::string& model, const std::string& layout) {
  const monitoring::label_set labels{
      {"job_id", job_id}, {"run_dir", run_dir}, {"model", model}, {"layout", layout}};
  job_info->with(labels).set(1);
  job_info->retain_only({labels});
}

std::string model_words(const model_config& m) {
  std::string out = "n_layer=" + std::to_string(m.n_layer) + " n_head=" + std::to_string(m.n_head) +
                    " d_model=" + std::to_string(m.d_model) +
                    " context=" + std::to_string(m.context) + " vocab=" + std::to_string(m.vocab);
  if (m.experts > 0)
    out += " experts=" + std::to_string(m.experts) + " top_k=" + std::to_string(m.top_k);
  return out;
}

std::string compiler_words() {
#if defined(__clang__)
  return "clang-" + std::to_string(__clang_major__) + "." + std::to_string(__clang_minor__) + "." +
         std::to_string(__clang_patchlevel__);
#elif defined(__GNUC__)
  return "gcc-" + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__) + "." +
         std::to_string(__GNUC_PATCHLEVEL__);
#else
  return "unknown";
#endif
}

void job_metrics::observe(const events::job_event& event) {
  using namespace events;
  std::visit(overloaded{
                 [this](const events::step& e) {
                   steps->inc();
                   tokens->inc(static_cast<double>(e.tokens));
                   loss->set(e.loss);
                   tokens_per_s->set(e.tokens_per_s);
                   step->set(static_cast<double>(e.step));
                   last_step_time->set(unix_seconds_now());
                   lr->set(e.lr);
                   compute_s->set(e.compute_s);
                   comm_s->set(e.comm_s);
                   control_s->set(e.control_s);
                   step_seconds->observe(e.step_s);
                   if (e.phases) add_phases(*e.phases, false);
                   if (e.goodput) goodput->set(*e.goodput);
                   if (e.mfu) set_mfu(*e.mfu);
                 },
                 [this](const events::goodput& e) {
                   add_phases(e.phases, true);
                   goodput->set(e.goodput);
                   set_mfu(e.mfu);
                   peak_flops->set(e.peak_flops);
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
                 [this](const events::etcd_state_lost&) { etcd_state_lost->inc(); },
                 [this](const job_ended& e) { exit_code->set(e.exit_code); },
                 [](const auto&) {},
             },
             event);
}

}  // namespace troupe::actors
