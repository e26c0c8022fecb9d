#include "bench/control_plane/checkpoint_figures.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/control_plane/measure.hpp"

namespace troupe::bench::control_plane {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

double seconds_since(int64_t from_ns, int64_t to_ns) {
  return static_cast<double>(to_ns - from_ns) / 1e9;
}

}  // namespace

checkpoint_figures checkpoints_of(const std::string& events, const std::string& run_dir,
                                  sim_ledger& ledger, int64_t steady_ns_at, int64_t unix_ms_at,
                                  int64_t before_unix_ms) {
  checkpoint_figures out;
  std::ifstream in(events);
  int64_t newest = -1;
  std::string path;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\":\"checkpoint") == std::string::npos) continue;
    const json e = json::parse(line, nullptr, false);
    if (!e.is_object()) continue;
    const std::string kind = e.value("event", "");
    if (kind == "checkpoint_failed") ++out.failed;
    if (kind != "checkpoint") continue;
    ++out.committed;
    if (e.value("unix_ms", int64_t{0}) <= before_unix_ms) ++out.committed_before;
    const int64_t step = e.value("step", int64_t{-1});
    const int64_t at_ns = steady_ns_at + (e.value("unix_ms", int64_t{0}) - unix_ms_at) * 1'000'000;
    if (step > newest) newest = step, path = e.value("path", "");
    const auto* s = ledger.step(step);
    if (!s || s->last_commit_ns.load() == 0 || s->last_share_ns.load() == 0) continue;
    out.shares_s.push_back(seconds_since(s->last_commit_ns.load(), s->last_share_ns.load()));
    out.commit_s.push_back(seconds_since(s->last_commit_ns.load(), at_ns));
    out.coordinator_s.push_back(seconds_since(s->last_share_ns.load(), at_ns));
  }
  if (newest >= 0) {
    const std::string manifest = (fs::path(path.empty() ? run_dir : path) / "manifest.json");
    out.manifest_bytes = file_bytes(manifest);
    std::ifstream m(manifest);
    const json doc = json::parse(m, nullptr, false);
    if (doc.is_object() && doc.contains("pieces") && doc["pieces"].is_array())
      out.manifest_pieces = static_cast<int64_t>(doc["pieces"].size());
  }
  return out;
}

}  // namespace troupe::bench::control_plane
