// A real Prometheus server scrapes a metrics_server in another process, driven by the
// reusable harness tests/tools/prometheus_harness.py.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <string>

#include "subprocess.hpp"

namespace troupe::monitoring {
namespace {

constexpr const char* fixture_path = TROUPE_METRICS_FIXTURE;
constexpr const char* harness_path = TROUPE_PROMETHEUS_HARNESS;
constexpr const char* python_path = TROUPE_TEST_PYTHON;
constexpr const char* prometheus_path = TROUPE_PROMETHEUS;

class prometheus_scrape : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::is_executable(prometheus_path)) {
      GTEST_SKIP() << "prometheus not found (configure found '" << prometheus_path
                   << "'); install the Debian package 'prometheus' to run this test";
    }
    if (!testing::is_executable(python_path)) {
      GTEST_SKIP() << "python3 not found at '" << python_path << "'";
    }
  }

  // Runs the harness to completion; returns its exit code and fills `output`.
  int run_harness(const std::vector<std::string>& args, std::string& output) {
    std::vector<std::string> argv = {python_path, harness_path, "--prometheus", prometheus_path};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string out_path = dir_.file("harness.out");
    testing::child_process harness(argv, {.output_path = out_path});
    const auto rc = harness.wait_for(std::chrono::seconds(150));
    output = testing::read_file(out_path);
    if (!rc) {
      harness.kill_and_reap();  // SIGTERM first: the harness then stops its prometheus
      ADD_FAILURE() << "harness still running after 150 s";
      return -1;
    }
    return *rc;
  }

  testing::temp_dir dir_;
};

// Starts the fixture (asking for `bearer_token` when not empty) and reads the port it chose.
std::uint16_t start_fixture(std::unique_ptr<testing::child_process>& fixture,
                            const std::string& bearer_token = "") {
  std::vector<std::string> argv{fixture_path, "--port", "0", "--max-seconds", "170"};
  if (!bearer_token.empty()) argv.insert(argv.end(), {"--bearer-token", bearer_token});
  fixture =
      std::make_unique<testing::child_process>(argv, testing::spawn_options{.stdout_pipe = true});
  const auto line = fixture->read_line();
  if (!line || line->rfind("port=", 0) != 0) return 0;
  return static_cast<std::uint16_t>(std::stoi(line->substr(5)));
}

TEST_F(prometheus_scrape, every_metric_kind_arrives_in_prometheus) {
  std::unique_ptr<testing::child_process> fixture;
  const std::uint16_t port = start_fixture(fixture);
  ASSERT_NE(port, 0) << "the fixture did not report its port";

  std::string output;
  const int rc =
      run_harness({"--target", "127.0.0.1:" + std::to_string(port), "--expect",
                   "troupe_fixture_steps_total", "--expect", "troupe_fixture_loss{rank=\"0\"}",
                   "--expect", "troupe_fixture_step_seconds_bucket{le=\"+Inf\"}", "--expect",
                   "troupe_fixture_step_seconds_count", "--expect",
                   "troupe_fixture_comm_bytes_total{op=\"all_gather\"}", "--expect",
                   "troupe_fixture_info{version=\"0.1.0\"}",
                   // the escaped label value survived the trip into Prometheus
                   "--expect", "troupe_fixture_info{note=\"quote\\\" backslash\\\\ newline\\n\"}",
                   "--timeout", "90"},
                  output);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("OK:"), std::string::npos) << output;
  std::cout << output;  // what Prometheus stored, for the test log

  // The test owns the fixture's pid and ends it; SIGTERM is a clean stop (exit 0).
  ::kill(fixture->pid(), SIGTERM);
  const auto fixture_rc = fixture->wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(fixture_rc.has_value()) << "fixture ignored SIGTERM";
  EXPECT_EQ(*fixture_rc, 0);
}

TEST_F(prometheus_scrape, harness_reports_missing_series_and_down_targets) {
  std::unique_ptr<testing::child_process> fixture;
  const std::uint16_t port = start_fixture(fixture);
  ASSERT_NE(port, 0) << "the fixture did not report its port";
  // A port nobody listens on: take one from the OS and release it.
  testing::child_process probe({python_path, "-c",
                                "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); "
                                "print(s.getsockname()[1])"},
                               {.stdout_pipe = true});
  const auto dead_port = probe.read_line();
  ASSERT_TRUE(dead_port.has_value());
  probe.wait_for(std::chrono::seconds(10));

  std::string output;
  const int rc = run_harness({"--target", "127.0.0.1:" + std::to_string(port), "--target",
                              "127.0.0.1:" + *dead_port, "--expect", "troupe_fixture_steps_total",
                              "--expect", "troupe_no_such_metric", "--timeout", "12"},
                             output);
  EXPECT_EQ(rc, 1) << output;
  EXPECT_NE(output.find("FAIL"), std::string::npos) << output;
  EXPECT_NE(output.find("troupe_no_such_metric"), std::string::npos) << output;
  EXPECT_EQ(output.find("no samples for: troupe_fixture_steps_total"), std::string::npos) << output;
  EXPECT_NE(output.find("127.0.0.1:" + *dead_port + " health: down"), std::string::npos) << output;
  // fixture is killed and reaped by pid when it goes out of scope.
}

// --metrics-token as Prometheus uses it: the real server reads the token from a file and sends
// it as a bearer token; without the token the same target is down (401).
TEST_F(prometheus_scrape, a_bearer_token_is_sent_by_prometheus_and_required_by_the_endpoint) {
  std::unique_ptr<testing::child_process> fixture;
  const std::uint16_t port = start_fixture(fixture, "job-7f3a-token");
  ASSERT_NE(port, 0) << "the fixture did not report its port";
  const std::string token_file = dir_.file("metrics.token");
  {
    std::ofstream out(token_file);
    out << "job-7f3a-token\n";
  }
  std::string output;
  int rc = run_harness({"--target", "127.0.0.1:" + std::to_string(port), "--bearer-token-file",
                        token_file, "--expect", "troupe_fixture_steps_total", "--timeout", "60"},
                       output);
  EXPECT_EQ(rc, 0) << output;
  rc = run_harness({"--target", "127.0.0.1:" + std::to_string(port), "--expect",
                    "troupe_fixture_steps_total", "--timeout", "12"},
                   output);
  EXPECT_EQ(rc, 1) << output;
  EXPECT_NE(output.find("127.0.0.1:" + std::to_string(port) + " health: down"), std::string::npos)
      << output;
}

}  // namespace
}  // namespace troupe::monitoring
