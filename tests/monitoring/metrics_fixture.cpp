// A small process that serves a live registry through metrics_server, for tests that scrape
// it from outside (the real Prometheus). Prints "port=N" on stdout once it listens, updates
// its metrics every 100 ms, and exits on SIGTERM/SIGINT or after --max-seconds (default 300),
// so it can never outlive a broken test for long. (The test also asks the kernel to send it
// SIGTERM if the test process dies; see tests/monitoring/subprocess.hpp.)
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "monitoring/http_server.hpp"
#include "monitoring/metrics.hpp"

namespace {

volatile std::sig_atomic_t stop_requested = 0;

void on_signal(int) { stop_requested = 1; }

}  // namespace

int main(int argc, char** argv) {
  using namespace troupe::monitoring;
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);

  int port = 0;
  int max_seconds = 300;
  metrics_server_limits limits;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--port") {
      port = std::atoi(argv[i + 1]);
    } else if (flag == "--max-seconds") {
      max_seconds = std::atoi(argv[i + 1]);
    } else if (flag == "--bearer-token") {
      limits.bearer_token = argv[i + 1];
    } else {
      std::fprintf(stderr, "usage: %s [--port N] [--max-seconds S] [--bearer-token T]\n", argv[0]);
      return 2;
    }
  }

  metrics_registry registry;
  counter& steps =
      registry.add_counter("troupe_fixture_steps_total", "Steps taken.", {{"rank", "0"}});
  gauge& loss = registry.add_gauge("troupe_fixture_loss", "Current loss.", {{"rank", "0"}});
  histogram& step_time = registry.add_histogram("troupe_fixture_step_seconds", "Step time.",
                                                {0.01, 0.1, 1}, {{"rank", "0"}});
  counter_family& bytes =
      registry.add_counter_family("troupe_fixture_comm_bytes_total", "Bytes sent by collective.");
  registry.add_gauge_family("troupe_fixture_info", "Build information.")
      .with({{"version", "0.1.0"}, {"note", "quote\" backslash\\ newline\n"}})
      .set(1);

  try {
    metrics_server server(registry, "127.0.0.1", static_cast<std::uint16_t>(port), limits);
    std::printf("port=%u\n", static_cast<unsigned>(server.port()));
    std::fflush(stdout);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(max_seconds);
    double current_loss = 10.0;
    while (stop_requested == 0 && std::chrono::steady_clock::now() < deadline) {
      steps.inc();
      current_loss *= 0.99;
      loss.set(current_loss);
      step_time.observe(0.05);
      bytes.with({{"op", "all_reduce"}}).inc(4096);
      bytes.with({{"op", "all_gather"}}).inc(1024);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    server.stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "metrics_fixture: %s\n", e.what());
    return 1;
  }
  return 0;
}
