// `troupe report`: reads a run's events.jsonl (every line on its own: a line that is not a
// JSON object with an "event" is counted and skipped) and writes one HTML file with inline SVG.

#include "cli/report.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <system_error>

#include "cli/command_line.hpp"
#include "cli/options.hpp"
#include "cli/report_svg.hpp"
#include "runtime/sys/printable.hpp"

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The phases of a step event's "phases" (rank-seconds summed over the ranks), in stacking
// order; a phase not named here is stacked after them.
const std::vector<std::string> known_phases = {
    "compute",          "exposed_comm", "bubble", "straggler_wait", "control",
    "checkpoint_stall", "recovery",     "redone", "forming",        "idle"};
const std::vector<std::string> palette = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr size_t max_points = 1500;  // per chart: longer runs are drawn from evenly spaced steps

struct step_row {
  double loss = NAN, tokens_per_s = NAN, step_s = NAN;
  int world = 0;
  std::vector<std::pair<std::string, double>> phases;  // rank-seconds by phase
};

struct recovery {
  double start = 0, end = 0;  // seconds from the start
  std::string reason;
};

struct timed {
  double at = 0;  // seconds from the start
  std::string label;
};

struct generation {
  double at = 0;
  long long number = 0;
  long long world = 0;
};

struct run_facts {
  long long lines = 0, events = 0, skipped = 0, jobs = 0, total_steps = 0, step_events = 0;
  std::optional<double> first_ms, last_ms, first_step_ms;
  std::map<long long, step_row> steps;  // by step number: a step done again replaces the first
  std::vector<double> step_times;       // every step event's step_s
  std::map<long long, double> val_loss;
  std::vector<generation> generations;
  std::vector<recovery> recoveries;
  std::optional<recovery> open_recovery;
  std::vector<timed> faults, lost, committed, failed;
  std::optional<json> goodput;
  std::optional<json> done;
  std::vector<std::string> phase_order;
};

std::optional<double> number_of(const json& e, const char* key) {
  auto it = e.find(key);
  if (it == e.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  // Beyond any step, time or loss a run reaches: left out rather than drawn or converted.
  if (!std::isfinite(v) || std::abs(v) > 1e15) return std::nullopt;
  return v;
}

// A whole number of `e` (a step, a world size): absent when missing or out of range.
std::optional<long long> count_of(const json& e, const char* key) {
  auto v = number_of(e, key);
  if (!v) return std::nullopt;
  return static_cast<long long>(*v);
}

std::string text_of(const json& e, const char* key) {
  auto it = e.find(key);
  if (it == e.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number()) return it->dump();
  return "";
}

std::string step_words(const json& e) {
  auto s = count_of(e, "step");
  return s ? "step " + std::to_string(*s) : "";
}

// Deeper nesting than any event has is refused before it reaches the parser.
bool shallow(const std::string& line) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : line) {
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

void take_step(run_facts& f, const json& e, double t_ms) {
  auto step = count_of(e, "step");
  if (!step) return;
  ++f.step_events;
  if (!f.first_step_ms) f.first_step_ms = t_ms;
  step_row row;
  row.loss = number_of(e, "loss").value_or(NAN);
  row.tokens_per_s = number_of(e, "tokens_per_s").value_or(NAN);
  row.step_s = number_of(e, "step_s").value_or(NAN);
  row.world = static_cast<int>(std::clamp<long long>(count_of(e, "world").value_or(0), 0, 1 << 20));
  if (std::isfinite(row.step_s)) f.step_times.push_back(row.step_s);
  if (auto total = count_of(e, "total_steps")) f.total_steps = *total;
  auto phases = e.find("phases");
  if (phases != e.end() && phases->is_object()) {
    for (const auto& [name, value] : phases->items())
      if (value.is_number() && std::isfinite(value.get<double>()))
        row.phases.emplace_back(name, value.get<double>());
  } else {  // runs made before the goodput accounting: per-rank means, times the world
    const double world = std::max(1, row.world);
    for (const auto& [key, name] : std::vector<std::pair<const char*, const char*>>{
             {"compute_s", "compute (mean x world)"},
             {"comm_s", "comm (mean x world)"},
             {"control_s", "control (mean x world)"},
             {"peer_wait_s", "peer wait (mean x world)"}})
      if (auto v = number_of(e, key)) row.phases.emplace_back(name, *v * world);
  }
  for (const auto& [name, value] : row.phases)
    if (std::find(f.phase_order.begin(), f.phase_order.end(), name) == f.phase_order.end())
      f.phase_order.push_back(name);
  f.steps[*step] = std::move(row);
}

void take(run_facts& f, const json& e) {
  const std::string kind = e["event"].get<std::string>();
  auto ms = number_of(e, "unix_ms");
  if (ms) {
    if (!f.first_ms || *ms < *f.first_ms) f.first_ms = *ms;
    if (!f.last_ms || *ms > *f.last_ms) f.last_ms = *ms;
  }
  const double t_ms = ms.value_or(f.last_ms.value_or(0));
  // Seconds from the first event; corrected to the job's start once everything is read.
  const double at = t_ms / 1000.0;
  if (kind == "job_start") {
    ++f.jobs;
  } else if (kind == "step") {
    take_step(f, e, t_ms);
  } else if (kind == "validation") {
    auto step = count_of(e, "step");
    auto v = number_of(e, "val_loss");
    if (step && v) f.val_loss[*step] = *v;
  } else if (kind == "generation") {
    f.generations.push_back(
        {at, count_of(e, "number").value_or(0), count_of(e, "world").value_or(0)});
  } else if (kind == "state") {
    const std::string from = text_of(e, "from"), to = text_of(e, "to");
    if (to == "recovering" && !f.open_recovery)
      f.open_recovery = recovery{at, at, text_of(e, "reason")};
    if (from == "recovering" && to != "recovering" && f.open_recovery) {
      f.open_recovery->end = at;
      f.recoveries.push_back(*f.open_recovery);
      f.open_recovery.reset();
    }
  } else if (kind == "fault") {
    f.faults.push_back({at, "fault " + text_of(e, "spec") + " (" + step_words(e) + ")"});
  } else if (kind == "diverged") {
    f.faults.push_back({at, "diverged at " + step_words(e)});
  } else if (kind == "rank_lost") {
    f.lost.push_back({at, "rank " + text_of(e, "rank") + " lost at " + step_words(e) + ": " +
                              text_of(e, "cause") + " " + text_of(e, "reason")});
  } else if (kind == "checkpoint") {
    f.committed.push_back({at, "checkpoint of " + step_words(e) + " committed"});
  } else if (kind == "checkpoint_failed") {
    f.failed.push_back({at, "checkpoint of " + step_words(e) + " failed: " + text_of(e, "error")});
  } else if (kind == "checkpoint_abandoned") {
    f.failed.push_back(
        {at, "checkpoint of " + step_words(e) + " abandoned: " + text_of(e, "reason")});
  } else if (kind == "goodput") {
    f.goodput = e;
  } else if (kind == "job_done") {
    f.done = e;
  }
}

run_facts read_events(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw usage_error("troupe report: cannot read " + path.string() +
                      ": check its permissions (the run directory is readable, the file is not)");
  run_facts f;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++f.lines;
    json e = shallow(line) ? json::parse(line, nullptr, false) : json();
    auto kind = e.is_object() ? e.find("event") : e.end();
    if (!e.is_object() || kind == e.end() || !kind->is_string()) {
      ++f.skipped;  // cut short by a crash, damaged, or not an event
      continue;
    }
    ++f.events;
    try {
      take(f, e);
    } catch (const json::exception&) {
      ++f.skipped;
    }
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

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

std::string seconds_words(double s) {
  if (!std::isfinite(s)) return "\xE2\x80\x93";
  if (s < 1) return svg::number(s * 1000, 3) + " ms";
  if (s < 120) return svg::number(s, 3) + " s";
  if (s < 7200) return svg::number(s / 60, 3) + " min";
  return svg::number(s / 3600, 3) + " h";
}

// Every `stride`-th entry of `steps` and the last one: at most max_points per chart.
std::vector<std::map<long long, step_row>::const_iterator> sampled(
    const std::map<long long, step_row>& steps) {
  std::vector<std::map<long long, step_row>::const_iterator> out;
  const size_t stride = std::max<size_t>(1, (steps.size() + max_points - 1) / max_points);
  size_t i = 0;
  for (auto it = steps.begin(); it != steps.end(); ++it, ++i)
    if (i % stride == 0 || std::next(it) == steps.end()) out.push_back(it);
  return out;
}

std::string loss_chart(const run_facts& f) {
  svg::series train{"train loss", "#1f77b4", {}};
  svg::series val{"validation loss", "#d62728", {}, true, true};
  for (auto it : sampled(f.steps)) train.points.emplace_back(it->first, it->second.loss);
  for (const auto& [step, v] : f.val_loss) val.points.emplace_back(step, v);
  return svg::line_chart("chart-loss", {"Loss by step", "step", "loss"}, {train, val});
}

std::string throughput_chart(const run_facts& f) {
  svg::series tps{"tokens/s", "#2ca02c", {}};
  for (auto it : sampled(f.steps)) tps.points.emplace_back(it->first, it->second.tokens_per_s);
  return svg::line_chart("chart-throughput", {"Throughput by step", "step", "tokens/s"}, {tps});
}

std::string phases_chart(const run_facts& f) {
  std::vector<std::string> order;
  for (const auto& p : known_phases)
    if (std::find(f.phase_order.begin(), f.phase_order.end(), p) != f.phase_order.end())
      order.push_back(p);
  for (const auto& p : f.phase_order)
    if (std::find(order.begin(), order.end(), p) == order.end()) order.push_back(p);
  std::vector<double> xs;
  std::vector<svg::layer> layers;
  for (size_t i = 0; i < order.size(); ++i)
    layers.push_back({order[i], palette[i % palette.size()], {}});
  for (auto it : sampled(f.steps)) {
    xs.push_back(static_cast<double>(it->first));
    for (size_t i = 0; i < order.size(); ++i) {
      double v = 0;
      for (const auto& [name, value] : it->second.phases)
        if (name == order[i]) v += value;
      layers[i].values.push_back(v);
    }
  }
  return svg::stacked_area_chart(
      "chart-phases",
      {"Where each step's time went (rank-seconds, stacked)", "step", "rank-seconds"}, xs, layers);
}

std::string timeline_chart(const run_facts& f) {
  const double end = (f.last_ms.value_or(0) - f.first_ms.value_or(0)) / 1000.0;
  std::vector<svg::span> spans;
  std::vector<svg::mark> marks;
  for (size_t i = 0; i < f.generations.size(); ++i) {
    const auto& g = f.generations[i];
    const double until = i + 1 < f.generations.size() ? f.generations[i + 1].at : end;
    spans.push_back({0, g.at, until,
                     "gen " + std::to_string(g.number) + ", world " + std::to_string(g.world),
                     i % 2 ? "#6baed6" : "#2171b5"});
  }
  auto recovery_span = [&](const recovery& r, bool open) {
    spans.push_back({2, r.start, open ? end : r.end,
                     (open ? "recovering (not finished): "
                           : "recovery " + seconds_words(r.end - r.start) + ": ") +
                         r.reason,
                     "#ff7f0e"});
  };
  for (const auto& r : f.recoveries) recovery_span(r, false);
  if (f.open_recovery) recovery_span(*f.open_recovery, true);
  for (const auto& t : f.faults) marks.push_back({1, t.at, t.label, "#d62728", 'x'});
  for (const auto& t : f.lost) marks.push_back({3, t.at, t.label, "#9467bd", 'd'});
  for (const auto& t : f.committed) marks.push_back({4, t.at, t.label, "#2ca02c", 'o'});
  for (const auto& t : f.failed) marks.push_back({4, t.at, t.label, "#d62728", 'x'});
  return svg::timeline_chart(
      "chart-timeline", {"Timeline", "seconds since the run's first event", ""},
      {"generations", "faults", "recoveries", "ranks lost", "checkpoints"}, 0, end, spans, marks,
      {{"generation", "#2171b5"},
       {"fault / failed checkpoint", "#d62728"},
       {"recovery", "#ff7f0e"},
       {"rank lost", "#9467bd"},
       {"checkpoint committed", "#2ca02c"}});
}

std::string headline_table(const run_facts& f, const std::string& run_dir) {
  std::vector<std::pair<std::string, std::string>> rows;
  const double wall = (f.last_ms.value_or(0) - f.first_ms.value_or(0)) / 1000.0;
  rows.emplace_back("run directory", run_dir);
  if (f.done) {
    rows.emplace_back("status", "finished, exit code " + text_of(*f.done, "exit_code") + ": " +
                                    text_of(*f.done, "message"));
  } else {
    rows.emplace_back("status",
                      "no job_done event: still running, or stopped without ending (report of "
                      "what was written so far)");
  }
  if (f.jobs > 1) rows.emplace_back("jobs in this run", std::to_string(f.jobs) + " (resumed)");
  const long long last_step = f.steps.empty() ? 0 : f.steps.rbegin()->first;
  rows.emplace_back("steps", std::to_string(last_step) +
                                 (f.total_steps ? " of " + std::to_string(f.total_steps) : "") +
                                 " (" + std::to_string(f.step_events) + " step events)");
  rows.emplace_back("wall time", seconds_words(wall));
  rows.emplace_back(
      "time to first step",
      f.first_step_ms ? seconds_words((*f.first_step_ms - *f.first_ms) / 1000.0) : "no step yet");
  rows.emplace_back("step time, median", seconds_words(percentile(f.step_times, 0.5)));
  rows.emplace_back("step time, p99", seconds_words(percentile(f.step_times, 0.99)));
  std::vector<double> tps;
  for (const auto& [step, row] : f.steps)
    if (std::isfinite(row.tokens_per_s)) tps.push_back(row.tokens_per_s);
  rows.emplace_back("tokens/s, median", svg::number(percentile(tps, 0.5)));
  rows.emplace_back("final train loss",
                    f.steps.empty() ? "\xE2\x80\x93" : svg::number(f.steps.rbegin()->second.loss));
  rows.emplace_back("final validation loss",
                    f.val_loss.empty() ? "\xE2\x80\x93"
                                       : svg::number(f.val_loss.rbegin()->second) + " (step " +
                                             std::to_string(f.val_loss.rbegin()->first) + ")");
  rows.emplace_back(
      "generations",
      std::to_string(f.generations.size()) +
          (f.generations.empty()
               ? ""
               : " (last: world " + std::to_string(f.generations.back().world) + ")"));
  std::vector<double> took;
  for (const auto& r : f.recoveries) took.push_back(r.end - r.start);
  rows.emplace_back("recoveries",
                    std::to_string(f.recoveries.size()) +
                        (took.empty() ? "" : ", median " + seconds_words(percentile(took, 0.5))) +
                        (f.open_recovery ? " (one still under way)" : ""));
  rows.emplace_back("ranks lost", std::to_string(f.lost.size()));
  rows.emplace_back("faults injected or divergences", std::to_string(f.faults.size()));
  rows.emplace_back("checkpoints", std::to_string(f.committed.size()) + " committed, " +
                                       std::to_string(f.failed.size()) + " failed or abandoned");
  if (f.goodput) {
    auto g = number_of(*f.goodput, "goodput");
    auto m = number_of(*f.goodput, "mfu");
    rows.emplace_back("goodput", g ? svg::number(*g * 100, 3) + " %" : "\xE2\x80\x93");
    rows.emplace_back("MFU", m ? svg::number(*m * 100, 3) + " %" : "\xE2\x80\x93");
    // Where every rank-second of the job went, as the accounting last counted it.
    auto phases = f.goodput->find("phases");
    if (phases != f.goodput->end() && phases->is_object()) {
      double total = 0;
      std::vector<std::pair<std::string, double>> parts;
      for (const auto& [name, value] : phases->items())
        if (value.is_number() && std::isfinite(value.get<double>())) {
          parts.emplace_back(name, value.get<double>());
          total += value.get<double>();
        }
      std::sort(parts.begin(), parts.end(),
                [](const auto& a, const auto& b) { return a.second > b.second; });
      std::string words;
      for (const auto& [name, value] : parts)
        words += (words.empty() ? "" : ", ") + name + " " + seconds_words(value) +
                 (total > 0 ? " (" + svg::number(value / total * 100, 3) + " %)" : "");
      rows.emplace_back("rank-seconds by phase", words.empty() ? "\xE2\x80\x93" : words);
    }
  } else {
    rows.emplace_back("goodput, MFU", "not recorded (no goodput event in this run)");
  }
  rows.emplace_back("events read", std::to_string(f.events));
  rows.emplace_back("malformed lines skipped", std::to_string(f.skipped));
  std::string s = "<table id=\"headline\">\n<caption>Headline numbers</caption>\n";
  for (const auto& [name, value] : rows)
    s += "<tr><th scope=\"row\">" + svg::escape(name) + "</th><td>" + svg::escape(value) +
         "</td></tr>\n";
  return s + "</table>\n";
}

std::string html(const run_facts& f, const std::string& run_dir) {
  std::string s =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>troupe "
      "report: " +
      svg::escape(run_dir) +
      "</title>\n<style>\n"
      "body { font-family: sans-serif; margin: 24px; color: #222; background: #fafafa; }\n"
      "h1 { font-size: 22px; }\n"
      "table#headline { border-collapse: collapse; margin-bottom: 24px; background: #fff; "
      "max-width: 1000px; }\n"
      "table#headline th, table#headline td { border: 1px solid #ddd; padding: 4px 10px; "
      "text-align: left; font-size: 14px; }\n"
      "table#headline th { background: #f0f0f0; font-weight: normal; }\n"
      "caption { text-align: left; font-weight: bold; padding: 6px 0; }\n"
      "svg { display: block; margin: 0 0 24px 0; border: 1px solid #ddd; max-width: 100%; "
      "height: auto; }\n"
      "text { font-family: sans-serif; }\n"
      "</style>\n</head>\n<body>\n<h1>troupe report: " +
      svg::escape(run_dir) + "</h1>\n";
  s += headline_table(f, run_dir);
  s += loss_chart(f);
  s += throughput_chart(f);
  s += phases_chart(f);
  s += timeline_chart(f);
  if (f.skipped > 0)
    s += "<p class=\"skipped\">" + std::to_string(f.skipped) +
         " line(s) of events.jsonl were not JSON event objects and were skipped.</p>\n";
  return s + "</body>\n</html>\n";
}

}  // namespace

std::string report_help() {
  return R"(usage: troupe report [RUN_DIR] [-o FILE]

Writes one self-contained HTML file (inline SVG, no scripts, nothing fetched) about a run,
finished or still running, from RUN_DIR/events.jsonl: loss and validation loss, tokens/s and
where each step's time went, by step; a timeline of generations, faults, recoveries, lost ranks
and checkpoints; and a table of headline numbers.

  RUN_DIR            the run directory (default runs/latest)
  -o, --output FILE  where to write it (default RUN_DIR/report.html)

Lines of events.jsonl that are not JSON events are skipped and counted in the report.
Exit codes: 0 written; 1 the file cannot be written; 2 no such run directory or no events.jsonl.
)";
}

int run_report(const std::vector<std::string>& args) {
  command_line cl("troupe report");
  cl.value("-o,--output");
  cl.parse(args, 1, "run directories (one)");
  std::string run_dir = cl.positional().empty() ? "" : cl.positional().front();
  std::string output = cl.last("--output").value_or("");
  if (cl.has("--output") && output.empty())
    throw usage_error("troupe report: --output needs a file name");
  if (run_dir.empty()) run_dir = "runs/latest";
  std::error_code ec;
  const fs::path dir(run_dir);
  if (!fs::exists(dir, ec))
    throw usage_error("troupe report: run directory '" + run_dir +
                      "' does not exist; give the --run-dir of a job (troupe run writes "
                      "runs/latest by default)");
  if (!fs::is_directory(dir, ec))
    throw usage_error("troupe report: '" + run_dir + "' is not a directory; give a run directory");
  const fs::path events = dir / "events.jsonl";
  if (!fs::exists(events, ec))
    throw usage_error("troupe report: '" + run_dir +
                      "' has no events.jsonl: not a run directory, or its job has not started "
                      "yet (troupe run --run-dir " +
                      run_dir + " writes it)");
  if (::access(events.c_str(), R_OK) != 0)
    throw usage_error("troupe report: cannot read " + events.string() + ": check its permissions");
  const run_facts facts = read_events(events);
  const std::string page = html(facts, run_dir);

  const fs::path out = output.empty() ? dir / "report.html" : fs::path(output);
  // Written beside its place and renamed: a reader never sees half a report.
  const fs::path tmp = out.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    o << page;
    o.flush();
    if (!o) {
      fs::remove(tmp, ec);
      std::fprintf(stderr,
                   "troupe report: cannot write %s: check that its directory exists and is "
                   "writable, or choose another file with -o\n",
                   sys::printable_lines(out.string()).c_str());
      return 1;
    }
  }
  fs::rename(tmp, out, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    std::fprintf(stderr, "troupe report: cannot write %s: %s\n",
                 sys::printable_lines(out.string()).c_str(), why.c_str());
    return 1;
  }
  std::printf("troupe report: wrote %s (%lld events, %lld malformed lines skipped)\n",
              sys::printable_lines(out.string()).c_str(), facts.events, facts.skipped);
  return 0;
}

}  // namespace troupe::cli
