#include "chaos/fault_spec.hpp"

#include <algorithm>
#include <charconv>
#include <map>

#include "runtime/config.hpp"

namespace troupe::chaos {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    auto end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

int64_t whole(const std::string& spec, const std::string& key, const std::string& v, int64_t lo,
              int64_t hi) {
  int64_t x = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || x < lo || x > hi)
    throw config_error("--fault '" + spec + "': " + key + " must be an integer in " +
                       std::to_string(lo) + ".." + std::to_string(hi) + ", got '" + v + "'");
  return x;
}

std::chrono::milliseconds duration_of(const std::string& spec, const std::string& v) {
  const bool ms = v.size() > 2 && v.ends_with("ms");
  const bool s = !ms && v.size() > 1 && v.back() == 's';
  if (!ms && !s)
    throw config_error("--fault '" + spec + "': for must be like 500ms or 3s, got '" + v + "'");
  const std::string digits = v.substr(0, v.size() - (ms ? 2 : 1));
  const int64_t n = whole(spec, "for", digits, 1, ms ? 3'600'000 : 3600);
  return std::chrono::milliseconds(ms ? n : n * 1000);
}

}  // namespace

fault parse_fault(const std::string& spec, int world, int nodes, int64_t steps) {
  const auto parts = split(spec, ':');
  fault f;
  f.spec = spec;
  if (parts[0] == "kill")
    f.kind = fault_action::kill;
  else if (parts[0] == "stop")
    f.kind = fault_action::stop;
  else
    throw config_error("--fault '" + spec + "': the kind must be kill or stop, got '" + parts[0] +
                       "'");
  std::map<std::string, std::string> fields;
  for (size_t i = 1; i < parts.size(); ++i) {
    auto eq = parts[i].find('=');
    if (eq == std::string::npos || eq == 0)
      throw config_error("--fault '" + spec + "': expected key=value, got '" + parts[i] + "'");
    if (!fields.emplace(parts[i].substr(0, eq), parts[i].substr(eq + 1)).second)
      throw config_error("--fault '" + spec + "': '" + parts[i].substr(0, eq) + "' given twice");
  }
  const bool rank = fields.count("rank") > 0, node = fields.count("node") > 0;
  if (rank == node)
    throw config_error("--fault '" + spec + "': name exactly one target, rank=R or node=N");
  if (node && f.kind != fault_action::kill)
    throw config_error("--fault '" + spec + "': only kill takes node=N");
  f.target = rank ? fault_target::rank : fault_target::node;
  f.id = static_cast<int>(rank ? whole(spec, "rank", fields["rank"], 0, world - 1)
                               : whole(spec, "node", fields["node"], 0, nodes - 1));
  if (!fields.count("step")) throw config_error("--fault '" + spec + "': step=S is required");
  f.step = whole(spec, "step", fields["step"], 1, steps);
  if (fields.count("for")) {
    if (f.kind != fault_action::stop)
      throw config_error("--fault '" + spec + "': only stop takes for=");
    f.duration = duration_of(spec, fields["for"]);
  }
  for (const auto& [key, value] : fields)
    if (key != "rank" && key != "node" && key != "step" && key != "for")
      throw config_error("--fault '" + spec + "': unknown field '" + key +
                         "' (known: rank, node, step, for)");
  return f;
}

std::vector<fault> parse_faults(const std::string& specs, int world, int nodes, int64_t steps) {
  std::vector<fault> out;
  if (specs.empty()) return out;
  for (const auto& s : split(specs, ';')) out.push_back(parse_fault(s, world, nodes, steps));
  std::stable_sort(out.begin(), out.end(),
                   [](const fault& a, const fault& b) { return a.step < b.step; });
  return out;
}

}  // namespace troupe::chaos
