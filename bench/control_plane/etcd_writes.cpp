#include "bench/control_plane/etcd_writes.hpp"

#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <vector>

#include "monitoring/http_client.hpp"

namespace troupe::bench::control_plane {
namespace {

// A process's command line, its NUL-separated arguments.
std::vector<std::string> cmdline_of(const std::filesystem::path& proc_dir) {
  std::ifstream in(proc_dir / "cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::string one;
  for (char c : all) {
    if (c != '\0') {
      one += c;
      continue;
    }
    args.push_back(one);
    one.clear();
  }
  return args;
}

// The value of a counter without labels in Prometheus text, if the body has it.
std::optional<double> counter(const std::string& body, const std::string& name) {
  std::istringstream lines(body);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(name + " ", 0) == 0) {
      try {
        return std::stod(line.substr(name.size() + 1));
      } catch (const std::exception&) {
        return std::nullopt;
      }
    }
  return std::nullopt;
}

}  // namespace

std::optional<uint16_t> local_etcd_port(const std::string& run_dir) {
  const std::string data_dir = run_dir + "/etcd";
  const std::string prefix = "http://127.0.0.1:";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const auto args = cmdline_of(entry.path());
    bool ours = false;
    for (size_t i = 0; i + 1 < args.size(); ++i)
      ours = ours || (args[i] == "--data-dir" && args[i + 1] == data_dir);
    if (!ours) continue;
    for (size_t i = 0; i + 1 < args.size(); ++i)
      if (args[i] == "--listen-client-urls" && args[i + 1].rfind(prefix, 0) == 0)
        return static_cast<uint16_t>(std::stoi(args[i + 1].substr(prefix.size())));
  }
  return std::nullopt;
}

std::optional<etcd_counts> scrape_etcd(uint16_t port) {
  try {
    const auto answer = monitoring::http_get("127.0.0.1", port, "/metrics", {},
                                             std::chrono::seconds(10), 16u << 20);
    const auto puts = counter(answer.body, "etcd_mvcc_put_total");
    const auto deletes = counter(answer.body, "etcd_mvcc_delete_total");
    const auto txns = counter(answer.body, "etcd_mvcc_txn_total");
    if (answer.status != 200 || !puts || !deletes || !txns) {
      std::cerr << "[control-plane] etcd's /metrics at port " << port
                << " lacks etcd_mvcc_put_total, etcd_mvcc_delete_total or etcd_mvcc_txn_total\n";
      return std::nullopt;
    }
    return etcd_counts{*puts, *deletes, *txns};
  } catch (const std::exception& e) {
    std::cerr << "[control-plane] could not scrape etcd's metrics: " << e.what() << "\n";
    return std::nullopt;
  }
}

}  // namespace troupe::bench::control_plane
