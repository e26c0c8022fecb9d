// The event -> metric mapping of the coordinator (actors/coordinator/job_metrics.cpp), read where
// Prometheus reads it: the rendered exposition text. Every event is given as the events.jsonl line
// a job writes, with a distinctive value in every field a metric takes, so a field that was renamed
// (in the event or in the mapping), wired to the wrong metric, or exported under another name
// shows up here as a missing sample or a wrong value instead of a quiet 0.
#include "actors/coordinator/job_metrics.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

#include "monitoring/events/events.hpp"
#include "monitoring/metrics.hpp"
#include "runtime/config.hpp"

namespace troupe::actors {
namespace {

using nlohmann::json;

/// Samples of an exposition text: "name{labels}" (as written) -> value.
std::map<std::string, double> parse_samples(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    if (space == std::string::npos) continue;
    const std::string value = line.substr(space + 1);
    samples[line.substr(0, space)] =
        value == "+Inf" ? HUGE_VAL : std::strtod(value.c_str(), nullptr);
  }
  return samples;
}

class job_metrics_exposition : public ::testing::Test {
 protected:
  monitoring::metrics_registry registry;
  job_metrics metrics{registry};

  /// Feeds one events.jsonl object (parsed as the file's readers parse it).
  void feed(const json& line) { metrics.observe(events::from_json(line)); }

  /// The value of `series` in the rendered text; fails the test if it is not there.
  double sample(const std::string& series) {
    const std::string text = registry.render_prometheus();
    const auto samples = parse_samples(text);
    const auto it = samples.find(series);
    if (it == samples.end()) {
      ADD_FAILURE() << series << " is not in the exposition:\n" << text;
      return -1;
    }
    return it->second;
  }

  bool has(const std::string& series) {
    return parse_samples(registry.render_prometheus()).count(series) != 0;
  }
};

json step_line() {
  return {{"event", "step"},
          {"step", 1234},
          {"loss", 2.71828},
          {"lr", 0.000375},
          {"tokens", 4096},
          {"tokens_per_s", 12345.5},
          {"world", 3},
          {"generation", 2},
          {"step_s", 0.3},
          {"compute_s", 0.0123},
          {"comm_s", 0.0456},
          {"control_s", 0.0789},
          {"peer_wait_s", 0.0011},
          {"total_steps", 5000}};
}

TEST_F(job_metrics_exposition, every_series_is_there_at_zero_before_any_event) {
  for (const char* name : {"troupe_steps_total",
                           "troupe_tokens_total",
                           "troupe_loss",
                           "troupe_validation_loss",
                           "troupe_tokens_per_second",
                           "troupe_world_size",
                           "troupe_generation",
                           "troupe_step",
                           "troupe_learning_rate",
                           "troupe_step_compute_seconds",
                           "troupe_step_comm_seconds",
                           "troupe_step_control_seconds",
                           "troupe_checkpoints_total",
                           "troupe_ranks_lost_total",
                           "troupe_job_state",
                           "troupe_stale_messages_total",
                           "troupe_step_seconds_count",
                           "troupe_recovery_seconds_count",
                           "troupe_checkpoint_stall_seconds_count",
                           "troupe_checkpoint_write_seconds_count",
                           "troupe_checkpoint_bytes_written_total",
                           "troupe_checkpoint_bytes_deduplicated_total",
                           "troupe_checkpoint_last_committed_step",
                           "troupe_checkpoint_failures_total",
                           "troupe_checkpoint_snapshot_buffer_bytes",
                           "troupe_divergences_total",
                           "troupe_divergence_rollbacks_total"})
    EXPECT_EQ(sample(name), 0) << name;
}

TEST_F(job_metrics_exposition, a_step_sets_each_of_its_series_from_its_own_field) {
  feed(step_line());
  EXPECT_EQ(sample("troupe_steps_total"), 1);
  EXPECT_EQ(sample("troupe_tokens_total"), 4096);
  EXPECT_EQ(sample("troupe_loss"), 2.71828);
  EXPECT_EQ(sample("troupe_learning_rate"), 0.000375);
  EXPECT_EQ(sample("troupe_tokens_per_second"), 12345.5);
  EXPECT_EQ(sample("troupe_step"), 1234);
  EXPECT_EQ(sample("troupe_step_compute_seconds"), 0.0123);
  EXPECT_EQ(sample("troupe_step_comm_seconds"), 0.0456);
  EXPECT_EQ(sample("troupe_step_control_seconds"), 0.0789);
  EXPECT_EQ(sample("troupe_step_seconds_sum"), 0.3);
  EXPECT_EQ(sample("troupe_step_seconds_count"), 1);
  // 0.3 s lands in the bucket of 0.32 (0.005 x 2^6), not in the one below.
  EXPECT_EQ(sample("troupe_step_seconds_bucket{le=\"0.16\"}"), 0);
  EXPECT_EQ(sample("troupe_step_seconds_bucket{le=\"0.32\"}"), 1);
  EXPECT_EQ(sample("troupe_step_seconds_bucket{le=\"+Inf\"}"), 1);

  // A second step adds to the counters and replaces the gauges.
  json next = step_line();
  next["step"] = 1235;
  next["tokens"] = 1000;
  next["loss"] = 2.5;
  next["step_s"] = 0.01;
  feed(next);
  EXPECT_EQ(sample("troupe_steps_total"), 2);
  EXPECT_EQ(sample("troupe_tokens_total"), 5096);
  EXPECT_EQ(sample("troupe_loss"), 2.5);
  EXPECT_EQ(sample("troupe_step"), 1235);
  EXPECT_EQ(sample("troupe_step_seconds_count"), 2);
  EXPECT_DOUBLE_EQ(sample("troupe_step_seconds_sum"), 0.31);
  EXPECT_EQ(sample("troupe_step_seconds_bucket{le=\"0.01\"}"), 1);
}

TEST_F(job_metrics_exposition, a_state_sets_the_job_state_from_its_value) {
  feed({{"event", "state"},
        {"from", "training"},
        {"to", "recovering"},
        {"value", 2},
        {"generation", 4},
        {"step", 77},
        {"reason", "rank 1 lost"}});
  EXPECT_EQ(sample("troupe_job_state"), 2);
  feed({{"event", "state"},
        {"from", "recovering"},
        {"to", "failed"},
        {"value", 4},
        {"generation", 4},
        {"step", 77},
        {"reason", "too few ranks"}});
  EXPECT_EQ(sample("troupe_job_state"), 4);
}

json generation_line(int number, const std::string& cause, int world, int start_step,
                     double recovery_s) {
  return {{"event", "generation"}, {"number", number},         {"world", world},
          {"spares", 0},           {"plan", json::object()},   {"reason", "test"},
          {"cause", cause},        {"start_step", start_step}, {"planned_with_abort", false},
          {"shrunk", false},       {"recovery_s", recovery_s}};
}

TEST_F(job_metrics_exposition, a_recovery_generation_counts_by_cause_and_times_the_recovery) {
  feed(generation_line(1, "", 4, 0, 0));
  EXPECT_EQ(sample("troupe_generation"), 1);
  EXPECT_EQ(sample("troupe_world_size"), 4);
  EXPECT_EQ(sample("troupe_recovery_seconds_count"), 0);  // the first generation is no recovery
  EXPECT_FALSE(has("troupe_recoveries_total{cause=\"\"}"));

  feed(step_line());
  feed(generation_line(7, "heartbeat", 3, 1200, 1.5));
  EXPECT_EQ(sample("troupe_generation"), 7);
  EXPECT_EQ(sample("troupe_world_size"), 3);
  EXPECT_EQ(sample("troupe_step"), 1200);  // the new generation resumes from its start step
  EXPECT_EQ(sample("troupe_recoveries_total{cause=\"heartbeat\"}"), 1);
  EXPECT_EQ(sample("troupe_recovery_seconds_sum"), 1.5);
  EXPECT_EQ(sample("troupe_recovery_seconds_count"), 1);
  EXPECT_EQ(sample("troupe_recovery_seconds_bucket{le=\"1.28\"}"), 0);
  EXPECT_EQ(sample("troupe_recovery_seconds_bucket{le=\"2.56\"}"), 1);

  feed(generation_line(8, "exit", 2, 1300, 0.25));
  EXPECT_EQ(sample("troupe_recoveries_total{cause=\"heartbeat\"}"), 1);
  EXPECT_EQ(sample("troupe_recoveries_total{cause=\"exit\"}"), 1);
  EXPECT_EQ(sample("troupe_recovery_seconds_sum"), 1.75);

  // Growing or rebalancing opens a generation but recovers nothing.
  feed(generation_line(9, "grow", 4, 1400, 9));
  feed(generation_line(10, "rebalance", 4, 1500, 9));
  EXPECT_EQ(sample("troupe_generation"), 10);
  EXPECT_EQ(sample("troupe_world_size"), 4);
  EXPECT_EQ(sample("troupe_recovery_seconds_count"), 2);
  EXPECT_FALSE(has("troupe_recoveries_total{cause=\"grow\"}"));
  EXPECT_FALSE(has("troupe_recoveries_total{cause=\"rebalance\"}"));
}

TEST_F(job_metrics_exposition, lost_ranks_and_stale_messages_are_counted) {
  feed({{"event", "rank_lost"},
        {"rank", 2},
        {"member", 5},
        {"node", 1},
        {"pid", 4242},
        {"cause", "connection"},
        {"reason", "closed"},
        {"step", 10},
        {"generation", 1}});
  feed({{"event", "rank_lost"},
        {"rank", 3},
        {"member", 6},
        {"node", 1},
        {"pid", 4243},
        {"cause", "heartbeat"},
        {"reason", "silent"},
        {"step", 10},
        {"generation", 1}});
  feed({{"event", "stale_message"},
        {"message", "step_done"},
        {"member", 5},
        {"message_generation", 1},
        {"generation", 2}});
  EXPECT_EQ(sample("troupe_ranks_lost_total"), 2);
  EXPECT_EQ(sample("troupe_stale_messages_total"), 1);
}

TEST_F(job_metrics_exposition, a_checkpoint_sets_each_of_its_series_from_its_own_field) {
  const json line = {{"event", "checkpoint"},
                     {"step", 1200},
                     {"path", "/runs/x/checkpoints/step-1200"},
                     {"generation", 3},
                     {"bytes_written", 111111},
                     {"bytes_deduplicated", 22222},
                     {"stall_s", 0.0625},
                     {"write_s", 0.75},
                     {"snapshot_buffer_bytes", 333333},
                     {"replicated_bytes", 4444}};
  feed(line);
  EXPECT_EQ(sample("troupe_checkpoints_total"), 1);
  EXPECT_EQ(sample("troupe_checkpoint_last_committed_step"), 1200);
  EXPECT_EQ(sample("troupe_checkpoint_bytes_written_total"), 111111);
  EXPECT_EQ(sample("troupe_checkpoint_bytes_deduplicated_total"), 22222);
  EXPECT_EQ(sample("troupe_checkpoint_snapshot_buffer_bytes"), 333333);
  EXPECT_EQ(sample("troupe_checkpoint_stall_seconds_sum"), 0.0625);
  EXPECT_EQ(sample("troupe_checkpoint_stall_seconds_count"), 1);
  EXPECT_EQ(sample("troupe_checkpoint_write_seconds_sum"), 0.75);
  EXPECT_EQ(sample("troupe_checkpoint_write_seconds_count"), 1);
  // 0.75 s: above 0.512 (0.001 x 2^9), within 1.024.
  EXPECT_EQ(sample("troupe_checkpoint_write_seconds_bucket{le=\"0.512\"}"), 0);
  EXPECT_EQ(sample("troupe_checkpoint_write_seconds_bucket{le=\"1.024\"}"), 1);

  json later = line;
  later["step"] = 1300;
  later["bytes_written"] = 9;
  later["bytes_deduplicated"] = 1;
  later["snapshot_buffer_bytes"] = 7;
  feed(later);
  EXPECT_EQ(sample("troupe_checkpoints_total"), 2);
  EXPECT_EQ(sample("troupe_checkpoint_last_committed_step"), 1300);
  EXPECT_EQ(sample("troupe_checkpoint_bytes_written_total"), 111120);
  EXPECT_EQ(sample("troupe_checkpoint_bytes_deduplicated_total"), 22223);
  EXPECT_EQ(sample("troupe_checkpoint_snapshot_buffer_bytes"), 7);

  feed({{"event", "checkpoint_failed"}, {"step", 1400}, {"error", "disk full"}});
  feed({{"event", "checkpoint_failed"}, {"step", 1500}, {"ranks_failed", 2}, {"error", "EIO"}});
  EXPECT_EQ(sample("troupe_checkpoint_failures_total"), 2);
  EXPECT_EQ(sample("troupe_checkpoints_total"), 2);
  EXPECT_EQ(sample("troupe_checkpoint_last_committed_step"), 1300);
}

TEST_F(job_metrics_exposition, divergences_count_and_only_rollbacks_roll_back) {
  auto diverged = [](const std::string& action) {
    return json{{"event", "diverged"},      {"step", 50},           {"generation", 1},
                {"what", "loss is nan"},    {"policy", "rollback"}, {"action", action},
                {"rollbacks", 1},           {"max_rollbacks", 3},   {"committed_step", 40},
                {"skipped_steps", {45, 46}}};
  };
  feed(diverged("rollback"));
  feed(diverged("rollback"));
  feed(diverged("stop"));
  EXPECT_EQ(sample("troupe_divergences_total"), 3);
  EXPECT_EQ(sample("troupe_divergence_rollbacks_total"), 2);
}

TEST_F(job_metrics_exposition, a_validation_sets_the_validation_loss) {
  feed({{"event", "validation"}, {"step", 100}, {"val_loss", 1.618}, {"generation", 1}});
  EXPECT_EQ(sample("troupe_validation_loss"), 1.618);
  EXPECT_EQ(sample("troupe_loss"), 0);  // not the training loss
}

// The goodput accounting (issue 28): a step's "phases" add its rank-seconds to
// troupe_rank_seconds_total{phase}; a "goodput" event carries the totals so far, which the
// counters are brought up to (not added again), and sets the ratio, MFU and peak gauges.
TEST_F(job_metrics_exposition, phases_and_goodput_set_the_rank_seconds_and_ratios) {
  const char* phases[] = {"compute",          "exposed_comm", "bubble", "straggler_wait", "control",
                          "checkpoint_stall", "recovery",     "redone", "forming",        "idle"};
  for (const char* p : phases)  // every phase from the first scrape, at 0
    EXPECT_EQ(sample(std::string("troupe_rank_seconds_total{phase=\"") + p + "\"}"), 0) << p;
  EXPECT_EQ(sample("troupe_goodput_ratio"), 0);
  EXPECT_EQ(sample("troupe_mfu_ratio"), 0);
  EXPECT_EQ(sample("troupe_mfu"), 0);
  EXPECT_EQ(sample("troupe_peak_flops"), 0);

  json step = step_line();
  step["phases"] = {
      {"compute", 1.25},  {"exposed_comm", 0.5},      {"bubble", 0.125}, {"straggler_wait", 0.0625},
      {"control", 0.375}, {"checkpoint_stall", 0.25}, {"redone", 0}};
  feed(step);
  feed(step);
  EXPECT_EQ(sample("troupe_rank_seconds_total{phase=\"compute\"}"), 2.5);
  EXPECT_EQ(sample("troupe_rank_seconds_total{phase=\"exposed_comm\"}"), 1);
  EXPECT_EQ(sample("troupe_rank_seconds_total{phase=\"bubble\"}"), 0.25);
  EXPECT_EQ(sample("troupe_rank_seconds_total{phase=\"straggler_wait\"}"), 0.125);
  EXPECT_EQ(sample("troupe_rank_seconds_total{phase=\"control\"}"), 0.75);
  EXPECT_EQ(sample("troupe_rank_seconds_total{phase=\"checkpoint_stall\"}"), 0.5);
  EXPECT_EQ(sample("troupe_rank_seconds_total{phase=\"redone\"}"), 0);

  // Totals that include the two steps above and time outside steps.
  json totals = {{"compute", 3.5},   {"exposed_comm", 1},
                 {"bubble", 0.25},   {"straggler_wait", 0.125},
                 {"control", 0.75},  {"checkpoint_stall", 0.5},
                 {"recovery", 2.25}, {"redone", 0.625},
                 {"forming", 4.5},   {"idle", 1.5}};
  feed({{"event", "goodput"},
        {"step", 40},
        {"generation", 2},
        {"wall_s", 3.75},
        {"slots", 4},
        {"rank_seconds", 15},
        {"phases", totals},
        {"goodput", 0.2333},
        {"mfu", 0.0421},
        {"peak_flops", 1.5e11},
        {"tokens", 163840}});
  for (const auto& [phase, value] : totals.items())
    EXPECT_EQ(sample("troupe_rank_seconds_total{phase=\"" + phase + "\"}"), value.get<double>())
        << phase;
  EXPECT_EQ(sample("troupe_goodput_ratio"), 0.2333);
  EXPECT_EQ(sample("troupe_mfu_ratio"), 0.0421);
  EXPECT_EQ(sample("troupe_mfu"), 0.0421);
  EXPECT_EQ(sample("troupe_peak_flops"), 1.5e11);
}

// Issue 35: goodput and MFU read 0 through a whole healthy run, as goodput events come only
// at generation changes and the end. Each step carries them so far, and sets both gauges.
TEST_F(job_metrics_exposition, each_step_sets_goodput_and_mfu_so_far) {
  json step = step_line();
  feed(step);  // a log written before steps carried them: the gauges stay as they were
  EXPECT_EQ(sample("troupe_goodput_ratio"), 0);
  EXPECT_EQ(sample("troupe_mfu_ratio"), 0);
  step["goodput"] = 0.4375;
  step["mfu"] = 0.03125;
  feed(step);
  EXPECT_EQ(sample("troupe_goodput_ratio"), 0.4375);
  EXPECT_EQ(sample("troupe_mfu_ratio"), 0.03125);
  EXPECT_EQ(sample("troupe_mfu"), 0.03125);  // the deprecated name, one more release
  step["goodput"] = 0.5;
  step["mfu"] = 0.0625;
  feed(step);
  EXPECT_EQ(sample("troupe_goodput_ratio"), 0.5);
  EXPECT_EQ(sample("troupe_mfu_ratio"), 0.0625);
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What TroupeStepsStalled and TroupeJobFailed (monitoring/prometheus/troupe.rules.yml) read:
// when the last step committed, and how the job ended (-1 while it runs).
TEST_F(job_metrics_exposition, the_last_step_time_and_the_exit_code_say_when_and_how) {
  EXPECT_EQ(sample("troupe_job_exit_code"), -1);
  const double started = sample("troupe_last_step_timestamp_seconds");
  EXPECT_GT(started, unix_now() - 60);  // from the start: a stall counts from it
  const double before = unix_now();
  feed(step_line());
  const double committed = sample("troupe_last_step_timestamp_seconds");
  EXPECT_GE(committed, before);
  EXPECT_LE(committed, unix_now());
  feed({{"event", "job_failed"},
        {"exit_code", 75},
        {"message", "preempted"},
        {"step", 9},
        {"generation", 1}});
  EXPECT_EQ(sample("troupe_job_exit_code"), 75);
}

TEST_F(job_metrics_exposition, build_and_job_info_name_the_binary_and_the_job) {
  const std::string build = std::string("troupe_build_info{compiler=\"") + compiler_words() +
                            "\",version=\"" + TROUPE_VERSION_FOR_TEST + "\"}";
  EXPECT_EQ(sample(build), 1);
  EXPECT_NE(compiler_words(), "unknown");
  model_config m;
  m.n_layer = 2;
  m.d_model = 64;
  EXPECT_EQ(model_words(m), "n_layer=2 n_head=4 d_model=64 context=64 vocab=256");
  m.experts = 4;
  m.top_k = 2;
  EXPECT_EQ(model_words(m), "n_layer=2 n_head=4 d_model=64 context=64 vocab=256 experts=4 top_k=2");
  metrics.set_job_info("j1", "/runs/a", "n_layer=2", "dp2xtp1xpp1");
  EXPECT_EQ(sample("troupe_job_info{job_id=\"j1\",layout=\"dp2xtp1xpp1\",model=\"n_layer=2\","
                   "run_dir=\"/runs/a\"}"),
            1);
  // Named again (a takeover in the same process): one series, the new one.
  metrics.set_job_info("j1", "/runs/b", "n_layer=2", "dp2xtp1xpp1");
  EXPECT_FALSE(
      has("troupe_job_info{job_id=\"j1\",layout=\"dp2xtp1xpp1\",model=\"n_layer=2\","
          "run_dir=\"/runs/a\"}"));
  EXPECT_EQ(sample("troupe_job_info{job_id=\"j1\",layout=\"dp2xtp1xpp1\",model=\"n_layer=2\","
                   "run_dir=\"/runs/b\"}"),
            1);
}

// Kinds that move no metric leave every sample as it was (a kind wired by mistake would not).
TEST_F(job_metrics_exposition, rank_gauges_follow_the_generation_and_stay_bounded) {
  metrics.set_rank_gauges({0.1, 0.2, 0.3}, {1.0, 1.5, 3.0}, {0, 0, 1}, 64);
  EXPECT_DOUBLE_EQ(sample("troupe_heartbeat_age_seconds{rank=\"2\"}"), 0.3);
  EXPECT_DOUBLE_EQ(sample("troupe_straggler_score{rank=\"2\"}"), 3.0);
  // The generation shrank to two ranks: rank 2 says nothing any more.
  metrics.set_rank_gauges({0.4, 0.5}, {1.0, 1.1}, {0, 0}, 64);
  EXPECT_FALSE(has("troupe_heartbeat_age_seconds{rank=\"2\"}"));
  EXPECT_FALSE(has("troupe_straggler_score{rank=\"2\"}"));
  EXPECT_DOUBLE_EQ(sample("troupe_heartbeat_age_seconds{rank=\"1\"}"), 0.5);
  // Above the bound: one series per node, its worst rank; no rank labels left.
  metrics.set_rank_gauges({0.1, 0.7, 0.2}, {1.0, 2.0, 1.2}, {0, 0, 1}, 2);
  EXPECT_DOUBLE_EQ(sample("troupe_heartbeat_age_seconds{node=\"0\"}"), 0.7);
  EXPECT_DOUBLE_EQ(sample("troupe_heartbeat_age_seconds{node=\"1\"}"), 0.2);
  EXPECT_DOUBLE_EQ(sample("troupe_straggler_score{node=\"0\"}"), 2.0);
  EXPECT_FALSE(has("troupe_heartbeat_age_seconds{rank=\"0\"}"));
}

TEST_F(job_metrics_exposition, other_kinds_leave_the_exposition_unchanged) {
  feed(step_line());
  const std::string before = registry.render_prometheus();
  feed({{"event", "memory"},
        {"rank", 1},
        {"step", 3},
        {"generation", 1},
        {"optimizer_state_bytes", 99},
        {"peak_rss_bytes", 98},
        {"zero", 1}});
  feed({{"event", "transport"},
        {"generation", 1},
        {"backend", "shm"},
        {"world", 9},
        {"nodes", 1},
        {"ranks_per_node", 9},
        {"shrunk", false}});
  feed({{"event", "interrupted"}, {"step", 5}, {"generation", 1}});
  EXPECT_EQ(registry.render_prometheus(), before);
}

// The exposition parses back as Prometheus would read the series this test relies on.
TEST(job_metrics_parse, the_sample_reader_reads_labels_and_special_values) {
  const auto s =
      parse_samples("# HELP x y\n# TYPE x counter\nx_total 3\nh_bucket{le=\"+Inf\"} 2\n");
  EXPECT_EQ(s.at("x_total"), 3);
  EXPECT_EQ(s.at("h_bucket{le=\"+Inf\"}"), 2);
  EXPECT_EQ(s.size(), 2u);
}

}  // namespace
}  // namespace troupe::actors
