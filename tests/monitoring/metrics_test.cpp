// Exact exposition text for each metric kind (as prometheus-cpp's TextSerializer writes it, in
// troupe's order), escaping, the naming rules, and concurrent use.
#include "monitoring/metrics.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace troupe::monitoring {
namespace {

TEST(metrics_registry, counter_text_is_exact) {
  metrics_registry registry;
  counter& c =
      registry.add_counter("troupe_steps_total", "Committed training steps.", {{"rank", "0"}});
  c.inc();
  c.inc(2);
  EXPECT_EQ(registry.render_prometheus(),
            "# HELP troupe_steps_total Committed training steps.\n"
            "# TYPE troupe_steps_total counter\n"
            "troupe_steps_total{rank=\"0\"} 3\n");
  EXPECT_EQ(c.value(), 3.0);
}

TEST(metrics_registry, gauge_text_is_exact) {
  metrics_registry registry;
  gauge& g = registry.add_gauge("troupe_loss", "Training loss of the last committed step.");
  g.set(2.5);
  g.inc(0.25);
  g.dec();
  EXPECT_EQ(registry.render_prometheus(),
            "# HELP troupe_loss Training loss of the last committed step.\n"
            "# TYPE troupe_loss gauge\n"
            "troupe_loss 1.75\n");
}

TEST(metrics_registry, histogram_text_is_exact) {
  metrics_registry registry;
  histogram& h = registry.add_histogram("troupe_step_seconds", "Wall time of one step.",
                                        {0.5, 1, 2.5}, {{"rank", "1"}});
  h.observe(0.25);
  h.observe(0.5);  // le is inclusive: lands in the 0.5 bucket
  h.observe(2);
  h.observe(100);  // only in +Inf
  EXPECT_EQ(registry.render_prometheus(),
            "# HELP troupe_step_seconds Wall time of one step.\n"
            "# TYPE troupe_step_seconds histogram\n"
            "troupe_step_seconds_count{rank=\"1\"} 4\n"
            "troupe_step_seconds_sum{rank=\"1\"} 102.75\n"
            "troupe_step_seconds_bucket{rank=\"1\",le=\"0.5\"} 2\n"
            "troupe_step_seconds_bucket{rank=\"1\",le=\"1\"} 2\n"
            "troupe_step_seconds_bucket{rank=\"1\",le=\"2.5\"} 3\n"
            "troupe_step_seconds_bucket{rank=\"1\",le=\"+Inf\"} 4\n");
}

TEST(metrics_registry, empty_histogram_exports_zeroes) {
  metrics_registry registry;
  registry.add_histogram("wait_seconds", "Wait.", {1});
  EXPECT_EQ(registry.render_prometheus(),
            "# HELP wait_seconds Wait.\n"
            "# TYPE wait_seconds histogram\n"
            "wait_seconds_count 0\n"
            "wait_seconds_sum 0\n"
            "wait_seconds_bucket{le=\"1\"} 0\n"
            "wait_seconds_bucket{le=\"+Inf\"} 0\n");
}

// Series of a labelled histogram: constant labels first, then the variable ones by name, le
// last; series in label order; label values escaped in every line of a series.
TEST(metrics_registry, labelled_histogram_text_is_exact) {
  metrics_registry registry;
  histogram_family& rpc =
      registry.add_histogram_family("troupe_rpc_seconds", "RPC time.", {0.1, 1}, {{"rank", "0"}});
  rpc.with({{"peer", "2"}, {"op", "join"}}).observe(0.05);
  rpc.with({{"op", "a\"b\\\nc"}, {"peer", "1"}}).observe(5);
  EXPECT_EQ(registry.render_prometheus(),
            "# HELP troupe_rpc_seconds RPC time.\n"
            "# TYPE troupe_rpc_seconds histogram\n"
            "troupe_rpc_seconds_count{rank=\"0\",op=\"a\\\"b\\\\\\nc\",peer=\"1\"} 1\n"
            "troupe_rpc_seconds_sum{rank=\"0\",op=\"a\\\"b\\\\\\nc\",peer=\"1\"} 5\n"
            "troupe_rpc_seconds_bucket{rank=\"0\",op=\"a\\\"b\\\\\\nc\",peer=\"1\",le=\"0.1\"} 0\n"
            "troupe_rpc_seconds_bucket{rank=\"0\",op=\"a\\\"b\\\\\\nc\",peer=\"1\",le=\"1\"} 0\n"
            "troupe_rpc_seconds_bucket{rank=\"0\",op=\"a\\\"b\\\\\\nc\",peer=\"1\",le=\"+Inf\"} 1\n"
            "troupe_rpc_seconds_count{rank=\"0\",op=\"join\",peer=\"2\"} 1\n"
            "troupe_rpc_seconds_sum{rank=\"0\",op=\"join\",peer=\"2\"} 0.05\n"
            "troupe_rpc_seconds_bucket{rank=\"0\",op=\"join\",peer=\"2\",le=\"0.1\"} 1\n"
            "troupe_rpc_seconds_bucket{rank=\"0\",op=\"join\",peer=\"2\",le=\"1\"} 1\n"
            "troupe_rpc_seconds_bucket{rank=\"0\",op=\"join\",peer=\"2\",le=\"+Inf\"} 1\n");
}

// prometheus-cpp leaves a family without series out of its scrape; troupe's readers (the
// README check, dashboards) expect HELP and TYPE of every registered metric.
TEST(metrics_registry, family_without_series_keeps_help_and_type) {
  metrics_registry registry;
  registry.add_gauge_family("troupe_heartbeat_age_seconds", "Age.");
  registry.add_counter_family("troupe_recoveries_total", "Recoveries.");
  registry.add_histogram_family("troupe_rpc_seconds", "RPC.", {1});
  EXPECT_EQ(registry.render_prometheus(),
            "# HELP troupe_heartbeat_age_seconds Age.\n"
            "# TYPE troupe_heartbeat_age_seconds gauge\n"
            "# HELP troupe_recoveries_total Recoveries.\n"
            "# TYPE troupe_recoveries_total counter\n"
            "# HELP troupe_rpc_seconds RPC.\n"
            "# TYPE troupe_rpc_seconds histogram\n");
}

TEST(metrics_registry, retained_series_stay_and_the_others_leave_the_text) {
  metrics_registry registry;
  gauge_family& age = registry.add_gauge_family("age_seconds", "Age.");
  age.with({{"rank", "0"}}).set(1);
  age.with({{"rank", "1"}}).set(2);
  age.with({{"rank", "2"}}).set(3);
  age.retain_only({{{"rank", "2"}}, {{"rank", "0"}}});
  EXPECT_EQ(registry.render_prometheus(),
            "# HELP age_seconds Age.\n# TYPE age_seconds gauge\n"
            "age_seconds{rank=\"0\"} 1\nage_seconds{rank=\"2\"} 3\n");
  EXPECT_EQ(age.with({{"rank", "1"}}).value(), 0.0);  // a new series, at zero
  age.retain_only({});
  EXPECT_EQ(registry.render_prometheus(), "# HELP age_seconds Age.\n# TYPE age_seconds gauge\n");
}

TEST(metrics_registry, nan_observation_goes_to_inf_bucket) {
  metrics_registry registry;
  histogram& h = registry.add_histogram("x_seconds", "X.", {1, 2});
  h.observe(std::numeric_limits<double>::quiet_NaN());
  const histogram::snapshot snap = h.take_snapshot();
  EXPECT_EQ(snap.cumulative, (std::vector<std::uint64_t>{0, 0, 1}));
  EXPECT_EQ(snap.count, 1u);
  EXPECT_TRUE(std::isnan(snap.sum));
  EXPECT_EQ(snap.upper_bounds, (std::vector<double>{1, 2}));
  h.observe(-std::numeric_limits<double>::infinity());
  h.observe(std::numeric_limits<double>::infinity());
  EXPECT_EQ(h.take_snapshot().cumulative, (std::vector<std::uint64_t>{1, 1, 3}));
}

TEST(metrics_registry, families_sort_series_and_merge_const_labels) {
  metrics_registry registry;
  counter_family& bytes = registry.add_counter_family(
      "troupe_comm_bytes_total", "Bytes moved by collectives.", {{"rank", "3"}});
  // Label order given by the caller does not matter; both calls name one series.
  bytes.with({{"op", "all_reduce"}, {"group", "dp"}}).inc(100);
  bytes.with({{"group", "dp"}, {"op", "all_reduce"}}).inc(28);
  bytes.with({{"op", "all_gather"}, {"group", "tp"}}).inc(7);
  EXPECT_EQ(&bytes.with({{"group", "dp"}, {"op", "all_reduce"}}),
            &bytes.with({{"op", "all_reduce"}, {"group", "dp"}}));
  EXPECT_EQ(registry.render_prometheus(),
            "# HELP troupe_comm_bytes_total Bytes moved by collectives.\n"
            "# TYPE troupe_comm_bytes_total counter\n"
            "troupe_comm_bytes_total{rank=\"3\",group=\"dp\",op=\"all_reduce\"} 128\n"
            "troupe_comm_bytes_total{rank=\"3\",group=\"tp\",op=\"all_gather\"} 7\n");
}

TEST(metrics_registry, families_render_in_name_order) {
  metrics_registry registry;
  registry.add_gauge("b_gauge", "B.").set(1);
  registry.add_gauge("a_gauge", "A.").set(2);
  EXPECT_EQ(registry.render_prometheus(),
            "# HELP a_gauge A.\n# TYPE a_gauge gauge\na_gauge 2\n"
            "# HELP b_gauge B.\n# TYPE b_gauge gauge\nb_gauge 1\n");
}

TEST(metrics_registry, label_values_and_help_are_escaped) {
  metrics_registry registry;
  registry.add_gauge_family("troupe_info", "Line one\nback\\slash \"quotes\" stay.")
      .with({{"path", "C:\\runs\\\"a\"\nb"}})
      .set(1);
  EXPECT_EQ(registry.render_prometheus(),
            "# HELP troupe_info Line one\\nback\\\\slash \"quotes\" stay.\n"
            "# TYPE troupe_info gauge\n"
            "troupe_info{path=\"C:\\\\runs\\\\\\\"a\\\"\\nb\"} 1\n");
}

// Values as prometheus-cpp 1.0.1 writes them: 16 significant digits, "+Inf", "-Inf" and "Nan"
// (Prometheus reads NaN in any case).
TEST(metrics_registry, special_values_are_formatted_for_prometheus) {
  metrics_registry registry;
  gauge_family& v = registry.add_gauge_family("v", "V.");
  v.with({{"k", "a"}}).set(std::numeric_limits<double>::infinity());
  v.with({{"k", "b"}}).set(-std::numeric_limits<double>::infinity());
  v.with({{"k", "c"}}).set(std::numeric_limits<double>::quiet_NaN());
  v.with({{"k", "d"}}).set(0.1);
  v.with({{"k", "e"}}).set(-3);
  v.with({{"k", "f"}}).set(1e20);
  v.with({{"k", "g"}}).set(1.5e-7);
  v.with({{"k", "h"}}).set(1e12);
  v.with({{"k", "i"}}).set(1.0 / 3.0);
  EXPECT_EQ(registry.render_prometheus(),
            "# HELP v V.\n# TYPE v gauge\n"
            "v{k=\"a\"} +Inf\nv{k=\"b\"} -Inf\nv{k=\"c\"} Nan\nv{k=\"d\"} 0.1\n"
            "v{k=\"e\"} -3\nv{k=\"f\"} 1e+20\nv{k=\"g\"} 1.5e-07\n"
            "v{k=\"h\"} 1000000000000\nv{k=\"i\"} 0.3333333333333333\n");
}

// A bound is kept as its le label reads, so the bucket counts what the label says; bounds
// that would share a label are refused (Prometheus would drop the scrape as a duplicate).
TEST(metrics_registry, bucket_bounds_are_kept_as_exposed) {
  metrics_registry registry;
  const std::vector<double> bounds = linear_buckets(0.1, 0.1, 3);  // 0.30000000000000004
  ASSERT_NE(bounds[2], 0.3);
  histogram_family& h = registry.add_histogram_family("h_seconds", "H.", bounds);
  EXPECT_EQ(h.upper_bounds(), (std::vector<double>{0.1, 0.2, 0.3}));
  EXPECT_EQ(&h, &registry.add_histogram_family("h_seconds", "H.", {0.1, 0.2, 0.3}));
  h.with({}).observe(0.30000000000000004);  // above le="0.3"
  const std::string text = registry.render_prometheus();
  EXPECT_NE(text.find("h_seconds_bucket{le=\"0.3\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_seconds_bucket{le=\"+Inf\"} 1\n"), std::string::npos) << text;

  EXPECT_THROW(registry.add_histogram("one_seconds", "One.", {1, std::nextafter(1.0, 2.0)}),
               metrics_error);
}

TEST(metrics_registry, bad_metric_names_are_rejected) {
  metrics_registry registry;
  for (const char* name : {"", "1steps_total", "steps-total", "steps total", "__steps_total",
                           "steps_total\n", "stépes_total"}) {
    EXPECT_THROW(registry.add_counter(name, "Help."), metrics_error) << name;
  }
  EXPECT_TRUE(is_valid_metric_name("job:steps:rate5m"));
  EXPECT_TRUE(is_valid_metric_name("_private"));
  EXPECT_FALSE(is_valid_metric_name("9lives"));
}

TEST(metrics_registry, lint_rules_that_promtool_enforces_are_rejected) {
  metrics_registry registry;
  EXPECT_THROW(registry.add_counter("troupe_steps", "Steps."), metrics_error);
  EXPECT_THROW(registry.add_gauge("troupe_live_total", "Live."), metrics_error);
  EXPECT_THROW(registry.add_histogram("troupe_wait_total", "Wait.", {1}), metrics_error);
  EXPECT_THROW(registry.add_gauge("troupe_live", ""), metrics_error);
  try {
    registry.add_counter("troupe_steps", "Steps.");
  } catch (const metrics_error& e) {
    EXPECT_NE(std::string(e.what()).find("troupe_steps_total"), std::string::npos) << e.what();
  }
}

TEST(metrics_registry, bad_label_names_are_rejected) {
  metrics_registry registry;
  EXPECT_THROW(registry.add_gauge("g1", "G.", {{"__name__", "x"}}), metrics_error);
  EXPECT_THROW(registry.add_gauge("g2", "G.", {{"a-b", "x"}}), metrics_error);
  EXPECT_THROW(registry.add_gauge("g3", "G.", {{"a:b", "x"}}), metrics_error);
  EXPECT_THROW(registry.add_gauge("g4", "G.", {{"", "x"}}), metrics_error);
  EXPECT_THROW(registry.add_gauge("g5", "G.", {{"a", "1"}, {"a", "2"}}), metrics_error);
  EXPECT_THROW(registry.add_histogram("h1_seconds", "H.", {1}, {{"le", "1"}}), metrics_error);

  histogram_family& h = registry.add_histogram_family("h2_seconds", "H.", {1});
  EXPECT_THROW(h.with({{"le", "5"}}), metrics_error);
  gauge_family& g = registry.add_gauge_family("g6", "G.", {{"rank", "0"}});
  EXPECT_THROW(g.with({{"rank", "1"}}), metrics_error);  // repeats a constant label
  EXPECT_THROW(g.with({{"x", "1"}, {"x", "2"}}), metrics_error);
  EXPECT_NO_THROW(g.with({{"le", "fine on a gauge"}}));
}

TEST(metrics_registry, bad_buckets_are_rejected) {
  metrics_registry registry;
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THROW(registry.add_histogram("a_seconds", "A.", {}), metrics_error);
  EXPECT_THROW(registry.add_histogram("b_seconds", "B.", {2, 1}), metrics_error);
  EXPECT_THROW(registry.add_histogram("c_seconds", "C.", {1, 1}), metrics_error);
  EXPECT_THROW(registry.add_histogram("d_seconds", "D.", {1, inf}), metrics_error);
  EXPECT_THROW((void)linear_buckets(0, 0, 3), metrics_error);
  EXPECT_THROW((void)exponential_buckets(0, 2, 3), metrics_error);
  EXPECT_EQ(linear_buckets(1, 0.5, 3), (std::vector<double>{1, 1.5, 2}));
  EXPECT_EQ(exponential_buckets(0.001, 10, 3), (std::vector<double>{0.001, 0.01, 0.1}));
  EXPECT_NO_THROW(registry.add_histogram("e_seconds", "E.", default_buckets()));
}

TEST(metrics_registry, reregistration_returns_the_same_metric_or_throws) {
  metrics_registry registry;
  counter& a = registry.add_counter("troupe_restarts_total", "Restarts.", {{"rank", "0"}});
  counter& b = registry.add_counter("troupe_restarts_total", "Restarts.", {{"rank", "0"}});
  EXPECT_EQ(&a, &b);
  EXPECT_THROW(registry.add_counter("troupe_restarts_total", "Restarts.", {{"rank", "1"}}),
               metrics_error);
  EXPECT_THROW(registry.add_gauge_family("troupe_restarts_total", "Restarts."), metrics_error);

  histogram& h1 = registry.add_histogram("troupe_rtt_seconds", "RTT.", {1, 2});
  EXPECT_EQ(&h1, &registry.add_histogram("troupe_rtt_seconds", "RTT.", {1, 2}));
  EXPECT_THROW(registry.add_histogram("troupe_rtt_seconds", "RTT.", {1, 3}), metrics_error);
}

TEST(metrics_registry, series_names_may_not_collide_with_histogram_parts) {
  metrics_registry registry;
  registry.add_histogram("troupe_rtt_seconds", "RTT.", {1});
  EXPECT_THROW(registry.add_gauge("troupe_rtt_seconds_count", "Clash."), metrics_error);
  EXPECT_THROW(registry.add_gauge("troupe_rtt_seconds_bucket", "Clash."), metrics_error);

  registry.add_gauge("troupe_wait_sum", "A gauge first.");
  EXPECT_THROW(registry.add_histogram("troupe_wait", "Clash.", {1}), metrics_error);
}

TEST(metrics_registry, negative_counter_increment_throws) {
  metrics_registry registry;
  counter& c = registry.add_counter("x_total", "X.");
  EXPECT_THROW(c.inc(-1), metrics_error);
  EXPECT_THROW(c.inc(std::numeric_limits<double>::quiet_NaN()), metrics_error);
  EXPECT_EQ(c.value(), 0.0);
}

TEST(metrics_registry, concurrent_updates_lose_nothing) {
  metrics_registry registry;
  counter& steps = registry.add_counter("steps_total", "Steps.");
  gauge& depth = registry.add_gauge("depth", "Depth.");
  histogram_family& times = registry.add_histogram_family("t_seconds", "T.", {0.5});
  constexpr int threads = 8;
  constexpr int per_thread = 20000;
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      histogram& mine = times.with({{"worker", std::to_string(t % 2)}});
      for (int i = 0; i < per_thread; ++i) {
        steps.inc();
        depth.inc();
        depth.dec(0.5);
        mine.observe(i % 2 == 0 ? 0.25 : 1.0);
      }
    });
  }
  // Scrapes run while the updates do; each must be self-consistent.
  std::thread scraper([&] {
    for (int i = 0; i < 50; ++i) {
      const std::string text = registry.render_prometheus();
      EXPECT_NE(text.find("# TYPE steps_total counter"), std::string::npos);
    }
  });
  for (auto& w : workers) w.join();
  scraper.join();
  EXPECT_EQ(steps.value(), threads * per_thread);
  EXPECT_EQ(depth.value(), threads * per_thread * 0.5);
  std::uint64_t total = 0;
  for (const char* w : {"0", "1"}) {
    const histogram::snapshot snap = times.with({{"worker", w}}).take_snapshot();
    EXPECT_EQ(snap.cumulative.back(), snap.count);
    EXPECT_EQ(snap.cumulative.front() * 2, snap.count);
    total += snap.count;
  }
  EXPECT_EQ(total, static_cast<std::uint64_t>(threads * per_thread));
}

}  // namespace
}  // namespace troupe::monitoring
