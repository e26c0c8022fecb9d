#include "chaos/fault_spec.hpp"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
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
  else if (parts[0] == "slow")
    f.kind = fault_action::slow;
  else
    throw config_error("--fault '" + spec +
                       "': the kind must be kill, stop, slow or random, got '" + parts[0] + "'");
  std::map<std::string, std::string> fields;
  const bool coordinator = parts.size() > 1 && parts[1] == "coordinator";
  for (size_t i = coordinator ? 2 : 1; i < parts.size(); ++i) {
    auto eq = parts[i].find('=');
    if (eq == std::string::npos || eq == 0)
      throw config_error("--fault '" + spec + "': expected key=value, got '" + parts[i] + "'");
    if (!fields.emplace(parts[i].substr(0, eq), parts[i].substr(eq + 1)).second)
      throw config_error("--fault '" + spec + "': '" + parts[i].substr(0, eq) + "' given twice");
  }
  const bool rank = fields.count("rank") > 0, node = fields.count("node") > 0;
  if (coordinator) {
    if (f.kind != fault_action::kill || rank || node)
      throw config_error("--fault '" + spec +
                         "': the coordinator can only be killed: kill:coordinator:step=S");
    f.target = fault_target::coordinator;
    f.id = -1;
    if (!fields.count("step")) throw config_error("--fault '" + spec + "': step=S is required");
    f.step = whole(spec, "step", fields["step"], 1, steps);
    for (const auto& [key, value] : fields)
      if (key != "step")
        throw config_error("--fault '" + spec + "': unknown field '" + key + "' (known: step)");
    return f;
  }
  if (rank == node)
    throw config_error("--fault '" + spec + "': name exactly one target, rank=R or node=N");
  if (node && f.kind != fault_action::kill)
    throw config_error("--fault '" + spec + "': only kill takes node=N");
  f.target = rank ? fault_target::rank : fault_target::node;
  f.id = static_cast<int>(rank ? whole(spec, "rank", fields["rank"], 0, world - 1)
                               : whole(spec, "node", fields["node"], 0, nodes - 1));
  if (f.kind == fault_action::slow) {
    if (node) throw config_error("--fault '" + spec + "': slow takes rank=R, not node=N");
    if (!fields.count("factor") || !fields.count("from"))
      throw config_error("--fault '" + spec + "': slow needs factor=F and from=S");
    const std::string& v = fields["factor"];
    double x = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || end != v.data() + v.size() || !(x > 1.0) || !(x <= 100.0))
      throw config_error("--fault '" + spec + "': factor must be a number in (1, 100], got '" + v +
                         "'");
    f.factor = x;
    fields["step"] = fields["from"];
    fields.erase("factor");
    fields.erase("from");
  }
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

double slowdown(const std::vector<fault>& faults, int rank, int64_t step) {
  double factor = 1.0;
  for (const auto& f : faults)
    if (f.kind == fault_action::slow && f.target == fault_target::rank && f.id == rank &&
        step >= f.step)
      factor = std::max(factor, f.factor);
  return factor;
}

std::vector<fault> expand_random(const std::string& spec, int world, int64_t steps) {
  const auto parts = split(spec, ':');
  std::map<std::string, std::string> fields;
  const bool coordinator = parts.size() > 1 && parts[1] == "coordinator";
  for (size_t i = coordinator ? 2 : 1; i < parts.size(); ++i) {
    auto eq = parts[i].find('=');
    if (eq == std::string::npos || eq == 0)
      throw config_error("--fault '" + spec + "': expected key=value, got '" + parts[i] + "'");
    if (!fields.emplace(parts[i].substr(0, eq), parts[i].substr(eq + 1)).second)
      throw config_error("--fault '" + spec + "': '" + parts[i].substr(0, eq) + "' given twice");
  }
  for (const auto& [key, value] : fields)
    if (key != "kills" && key != "seed" && key != "from" && key != "every")
      throw config_error("--fault '" + spec + "': unknown field '" + key +
                         "' (known: kills, seed, from, every)");
  if (!fields.count("kills") || !fields.count("seed"))
    throw config_error("--fault '" + spec + "': random needs kills=K and seed=S");
  const int64_t kills = whole(spec, "kills", fields["kills"], 1, 10000);
  uint64_t state = static_cast<uint64_t>(whole(spec, "seed", fields["seed"], 0, INT64_MAX));
  const int64_t from = fields.count("from") ? whole(spec, "from", fields["from"], 1, steps)
                                            : std::min<int64_t>(5, steps);
  const int64_t every =
      fields.count("every") ? whole(spec, "every", fields["every"], 1, steps) : 10;
  if (from + (kills - 1) * every > steps)
    throw config_error("--fault '" + spec + "': " + std::to_string(kills) + " kills " +
                       std::to_string(every) + " steps apart from step " + std::to_string(from) +
                       " do not fit in " + std::to_string(steps) +
                       " steps; raise --steps or lower kills/every");
  auto next = [&state] {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  // Spread the kills over the steps left: each gets `every` steps plus a random share of the slack.
  const int64_t slack = steps - from - (kills - 1) * every;
  std::vector<int64_t> extra(static_cast<size_t>(kills));
  for (auto& x : extra) x = static_cast<int64_t>(next() % static_cast<uint64_t>(slack / kills + 1));
  std::vector<fault> out;
  int64_t step = from;
  for (int64_t k = 0; k < kills; ++k) {
    step += extra[static_cast<size_t>(k)];
    fault f;
    f.kind = fault_action::kill;
    f.target = fault_target::rank;
    f.id = static_cast<int>(next() % static_cast<uint64_t>(world));
    f.step = std::min(step, steps);
    f.spec = spec;
    out.push_back(f);
    step += every;
  }
  return out;
}

std::vector<fault> parse_faults(const std::string& specs, int world, int nodes, int64_t steps) {
  std::vector<fault> out;
  if (specs.empty()) return out;
  for (const auto& s : split(specs, ';')) {
    if (s.rfind("random:", 0) == 0) {
      auto more = expand_random(s, world, steps);
      out.insert(out.end(), more.begin(), more.end());
    } else {
      out.push_back(parse_fault(s, world, nodes, steps));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const fault& a, const fault& b) { return a.step < b.step; });
  return out;
}

}  // namespace troupe::chaos
