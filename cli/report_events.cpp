// The report's facts from events.jsonl, each event read through its struct: a field renamed in
// monitoring/events fails to compile here instead of drawing a run as all zeros.
#include "cli/report_events.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <variant>

#include "runtime/config.hpp"

namespace troupe::cli::report {
namespace {

using nlohmann::json;

// A whole number of an event (a step, a world size): absent when out of range.
template <class Int>
std::optional<long long> whole(Int v) {
  const auto d = drawable(static_cast<double>(v));
  if (!d) return std::nullopt;
  return static_cast<long long>(*d);
}

template <class Int>
std::optional<long long> whole(const std::optional<Int>& v) {
  return v ? whole(*v) : std::nullopt;
}

// The envelope's number under `key` (unix_ms: event_log's, no struct's field).
std::optional<double> number_of(const json& e, const char* key) {
  auto it = e.find(key);
  if (it == e.end() || !it->is_number()) return std::nullopt;
  return drawable(it->get<double>());
}

template <class Step>
std::string step_words(const Step& step) {
  auto s = whole(step);
  return s ? "step " + std::to_string(*s) : "";
}

void take_step(run_facts& f, const events::step& e, double t_ms) {
  auto step = whole(e.step);
  if (!step) return;
  ++f.step_events;
  if (!f.first_step_ms) f.first_step_ms = t_ms;
  step_row row;
  row.loss = drawable(e.loss).value_or(NAN);
  row.tokens_per_s = drawable(e.tokens_per_s).value_or(NAN);
  row.step_s = drawable(e.step_s).value_or(NAN);
  row.world = static_cast<int>(std::clamp<long long>(whole(e.world).value_or(0), 0, 1 << 20));
  if (std::isfinite(row.step_s)) f.step_times.push_back(row.step_s);
  if (auto total = whole(e.total_steps)) f.total_steps = *total;
  if (e.phases && e.phases->is_object()) {
    for (const auto& [name, value] : e.phases->items())
      if (value.is_number() && std::isfinite(value.get<double>()))
        row.phases.emplace_back(name, value.get<double>());
  } else {  // runs made before the goodput accounting: per-rank means, times the world
    const double world = std::max(1, row.world);
    for (const auto& [seconds, name] :
         std::vector<std::pair<double, const char*>>{{e.compute_s, "compute (mean x world)"},
                                                     {e.comm_s, "comm (mean x world)"},
                                                     {e.control_s, "control (mean x world)"},
                                                     {e.peer_wait_s, "peer wait (mean x world)"}})
      if (auto v = drawable(seconds)) row.phases.emplace_back(name, *v * world);
  }
  for (const auto& [name, value] : row.phases)
    if (std::find(f.phase_order.begin(), f.phase_order.end(), name) == f.phase_order.end())
      f.phase_order.push_back(name);
  f.steps[*step] = std::move(row);
}

// A plan document (strategies::plan_doc) of the run: the first one and the newest are shown.
void take_layout(run_facts& f, const json& plan) {
  if (!plan.is_object()) return;
  if (f.first_layout.is_null()) f.first_layout = plan;
  f.last_layout = plan;
}

// One call per kind the report draws; every other kind (an untyped one included) adds nothing.
struct fold {
  run_facts& f;
  std::optional<double> ms;  // the event's unix_ms
  double t_ms;               // its time, or the last one known
  double at;                 // seconds (from the epoch until read_events moves the origin)

  void operator()(const events::job_start& e) {
    ++f.jobs;
    if (!f.first_start_ms && ms) f.first_start_ms = *ms;
    if (e.config.is_object()) f.config = e.config;
    take_layout(f, e.layout);
    f.done.reset();  // a resumed run: the earlier session's end is not the run's
  }
  void operator()(const events::step& e) { take_step(f, e, t_ms); }
  void operator()(const events::validation& e) {
    auto step = whole(e.step);
    auto v = drawable(e.val_loss);
    if (step && v) f.val_loss[*step] = *v;
  }
  void operator()(const events::generation& e) {
    f.generations.push_back({at, whole(e.number).value_or(0), whole(e.world).value_or(0)});
    take_layout(f, e.plan);
  }
  void operator()(const events::state& e) {
    if (e.to == "recovering" && !f.open_recovery) f.open_recovery = recovery{at, at, e.reason};
    if (e.from == "recovering" && e.to != "recovering" && f.open_recovery) {
      f.open_recovery->end = at;
      f.recoveries.push_back(*f.open_recovery);
      f.open_recovery.reset();
    }
  }
  void operator()(const events::fault& e) {
    f.faults.push_back({at, "fault " + e.spec.value_or("") + " (" + step_words(e.step) + ")"});
  }
  void operator()(const events::diverged& e) {
    f.faults.push_back({at, "diverged at " + step_words(e.step)});
  }
  void operator()(const events::rank_lost& e) {
    f.lost.push_back({at, "rank " + std::to_string(e.rank) + " lost at " + step_words(e.step) +
                              ": " + e.cause + " " + e.reason});
  }
  void operator()(const events::checkpoint& e) {
    f.committed.push_back({at, "checkpoint of " + step_words(e.step) + " committed"});
  }
  void operator()(const events::checkpoint_failed& e) {
    f.failed.push_back({at, "checkpoint of " + step_words(e.step) + " failed: " + e.error});
  }
  void operator()(const events::checkpoint_abandoned& e) {
    f.failed.push_back({at, "checkpoint of " + step_words(e.step) + " abandoned: " + e.reason});
  }
  void operator()(const events::goodput& e) { f.goodput = e; }
  void operator()(const events::job_ended& e) { f.done = ending{e, ms}; }
  template <class Other>
  void operator()(const Other&) {}
};

}  // namespace

std::optional<double> drawable(double v) {
  if (!std::isfinite(v) || std::abs(v) > 1e15) return std::nullopt;
  return v;
}

bool shallow(const std::string& text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > 64) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

run_facts read_events(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw usage_error("troupe report: cannot read " + path.string() +
                      ": check its permissions (the run directory is readable, the file is not)");
  run_facts f;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++f.lines;
    const json e = shallow(line) ? json::parse(line, nullptr, false) : json();
    auto kind = e.is_object() ? e.find("event") : e.end();
    if (!e.is_object() || kind == e.end() || !kind->is_string()) {
      ++f.skipped;  // cut short by a crash, damaged, or not an event
      continue;
    }
    events::job_event typed;
    try {
      typed = events::from_json(e);
    } catch (const json::exception&) {
      ++f.skipped;  // a kind this build knows, its fields damaged or not this build's
      continue;
    }
    ++f.events;
    auto ms = number_of(e, "unix_ms");
    if (ms) {
      if (!f.first_ms || *ms < *f.first_ms) f.first_ms = *ms;
      if (!f.last_ms || *ms > *f.last_ms) f.last_ms = *ms;
    }
    const double t_ms = ms.value_or(f.last_ms.value_or(0));
    // Seconds from the first event; corrected to the job's start once everything is read.
    std::visit(fold{f, ms, t_ms, t_ms / 1000.0}, typed);
  }
  if (in.bad()) throw std::runtime_error("cannot read " + path.string());
  // Times from the start of the run (its first event), in seconds.
  const double origin = f.first_ms.value_or(0) / 1000.0;
  for (auto& g : f.generations) g.at -= origin;
  for (auto* list : {&f.faults, &f.lost, &f.committed, &f.failed})
    for (auto& t : *list) t.at -= origin;
  for (auto& r : f.recoveries) {
    r.start -= origin;
    r.end -= origin;
  }
  if (f.open_recovery) f.open_recovery->start -= origin;
  return f;
}

}  // namespace troupe::cli::report
