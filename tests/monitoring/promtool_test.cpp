// promtool, Prometheus' own parser and linter, accepts what render_prometheus() writes.
#include <gtest/gtest.h>

#include <fstream>
#include <limits>

#include "monitoring/metrics.hpp"
#include "subprocess.hpp"

namespace troupe::monitoring {
namespace {

metrics_registry& fill(metrics_registry& registry) {
  registry.add_counter("troupe_steps_total", "Committed steps.", {{"rank", "0"}}).inc(42);
  counter_family& bytes = registry.add_counter_family(
      "troupe_comm_bytes_total", "Bytes moved by collectives.", {{"rank", "0"}});
  bytes.with({{"op", "all_reduce"}, {"group", "dp"}}).inc(1e12);
  bytes.with({{"op", "all_to_all"}, {"group", "ep"}}).inc(0.5);
  registry.add_gauge("troupe_loss", "Training loss.\nSecond line with a \\ backslash.").set(2.5);
  gauge_family& world = registry.add_gauge_family("troupe_world_size", "Ranks alive.");
  world.with({}).set(8);
  registry.add_gauge("troupe_lr", "Learning rate.").set(3e-4);
  registry.add_gauge("troupe_grad_norm", "Gradient norm.")
      .set(std::numeric_limits<double>::quiet_NaN());
  registry.add_gauge("troupe_best_loss", "Best loss.").set(std::numeric_limits<double>::infinity());
  registry.add_gauge_family("troupe_build_info", "Build information.")
      .with({{"version", "0.1.0"}, {"path", "C:\\runs\\\"quoted\"\nnext"}})
      .set(1);
  histogram& step = registry.add_histogram("troupe_step_seconds", "Step time.",
                                           exponential_buckets(0.001, 2, 12), {{"rank", "0"}});
  for (int i = 0; i < 100; ++i) step.observe(0.001 * i);
  histogram_family& rtt =
      registry.add_histogram_family("troupe_rpc_seconds", "RPC time.", default_buckets());
  rtt.with({{"peer", "1"}}).observe(0.2);
  rtt.with({{"peer", "2"}}).observe(20);
  registry.add_histogram("troupe_empty_seconds", "Never observed.", {1});
  return registry;
}

TEST(promtool, check_metrics_accepts_every_kind) {
  const std::string promtool = TROUPE_PROMTOOL;
  if (!testing::is_executable(promtool)) {
    GTEST_SKIP() << "promtool not found (configure found '" << promtool
                 << "'); install the Debian package 'prometheus' to run this test";
  }
  metrics_registry registry;
  const std::string text = fill(registry).render_prometheus();

  testing::temp_dir dir;
  const std::string input = dir.file("metrics.txt");
  const std::string output = dir.file("promtool.out");
  std::ofstream(input) << text;
  testing::child_process check({promtool, "check", "metrics"},
                               {.stdin_path = input, .output_path = output});
  const auto rc = check.wait_for(std::chrono::seconds(60));
  ASSERT_TRUE(rc.has_value()) << "promtool did not finish within 60 s";
  EXPECT_EQ(*rc, 0) << "promtool check metrics said:\n"
                    << testing::read_file(output) << "\non this input:\n"
                    << text;
  EXPECT_EQ(testing::read_file(output), "");  // no lint warnings either
}

}  // namespace
}  // namespace troupe::monitoring
