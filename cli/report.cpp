// `troupe report`: the facts of a run's events.jsonl (cli/report_events.hpp) drawn as one HTML
// file with inline SVG.

#include "cli/report.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <system_error>

#include "actors/coordinator/job/goodput.hpp"
#include "cli/command_line.hpp"
#include "cli/options.hpp"
#include "cli/report_events.hpp"
#include "cli/report_svg.hpp"
#include "runtime/sys/printable.hpp"

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A colour for each phase of the goodput accounting (actors/coordinator/job/goodput.hpp), by its
// place in that enum: the same phase has the same colour in every report, whichever phases a run
// has.
constexpr std::array<const char*, actors::phase_count> phase_colours = {
    "#2ca02c",  // compute: the useful work
    "#1f77b4",  // exposed_comm
    "#9ecae1",  // bubble
    "#ff7f0e",  // straggler_wait
    "#7f7f7f",  // control
    "#9467bd",  // checkpoint_stall
    "#d62728",  // recovery
    "#e377c2",  // redone
    "#8c564b",  // forming
    "#c7c7c7",  // idle
};
// Runs written before the accounting split steps into the ranks' own measures (per-rank means,
// drawn times the world): each takes the colour of the phase it became.
const std::vector<std::pair<std::string, actors::phase>> legacy_phases = {
    {"compute (mean x world)", actors::phase::compute},
    {"comm (mean x world)", actors::phase::exposed_comm},
    {"control (mean x world)", actors::phase::control},
    {"peer wait (mean x world)", actors::phase::straggler_wait}};
// For a phase this build does not know (a newer writer): chosen by the name's hash, so stable.
const std::vector<std::string> spare_colours = {"#bcbd22", "#17becf", "#393b79", "#637939",
                                                "#8c6d31", "#843c39", "#7b4173", "#5254a3"};

// Where a phase stacks (bottom first) and its colour.
std::pair<int, std::string> phase_place(const std::string& name) {
  for (int i = 0; i < actors::phase_count; ++i)
    if (actors::phase_name(static_cast<actors::phase>(i)) == name) return {i, phase_colours[i]};
  for (const auto& [legacy, p] : legacy_phases)
    if (legacy == name) return {static_cast<int>(p), phase_colours[static_cast<size_t>(p)]};
  uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 16777619u;
  return {actors::phase_count, spare_colours[h % spare_colours.size()]};
}

// Per chart: a series longer than this is drawn from the means (and ranges) of runs of steps.
constexpr size_t max_points = 1500;
// The phase chart's columns: stacked areas need a few pixels per column to be read.
constexpr size_t max_phase_columns = 450;

// Numbers and words of a plan document (strategies::plan_doc), which no event struct spells.
std::optional<long long> count_of(const json& doc, const char* key) {
  auto it = doc.find(key);
  if (it == doc.end() || !it->is_number()) return std::nullopt;
  auto v = report::drawable(it->get<double>());
  if (!v) return std::nullopt;
  return static_cast<long long>(*v);
}

std::string text_of(const json& doc, const char* key) {
  auto it = doc.find(key);
  if (it == doc.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number()) return it->dump();
  return "";
}

using report::run_facts;

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

// Centred moving means of `ys` over `window` values (missing values left out): a curve that
// keeps the series' level without its step-to-step noise. Near either end the window narrows
// to what is there on both sides, so the curve starts and ends where the series does (a
// one-sided mean would bend the steep start of a loss curve).
std::vector<double> centred_means(const std::vector<double>& ys, size_t window) {
  std::vector<double> sum(ys.size() + 1, 0.0);
  std::vector<size_t> count(ys.size() + 1, 0);
  for (size_t i = 0; i < ys.size(); ++i) {
    const bool ok = std::isfinite(ys[i]);
    sum[i + 1] = sum[i] + (ok ? ys[i] : 0.0);
    count[i + 1] = count[i] + (ok ? 1 : 0);
  }
  std::vector<double> out(ys.size(), NAN);
  for (size_t i = 0; i < ys.size(); ++i) {
    const size_t half = std::min({window / 2, i, ys.size() - 1 - i});
    const size_t lo = i - half, hi = i + half + 1;
    const size_t n = count[hi] - count[lo];
    if (n > 0 && std::isfinite(ys[i])) out[i] = (sum[hi] - sum[lo]) / static_cast<double>(n);
  }
  return out;
}

// The smoothing window for a series of n steps: about 2 % of the run, odd, at least 5.
size_t smoothing_window(size_t n) { return std::max<size_t>(5, n / 50) | 1; }

// A per-step series drawn as its raw values (a faint line, or the band of each run of steps
// when there are more steps than max_points) beside its centred moving mean.
struct drawn_series {
  std::vector<svg::series> lines;
  std::vector<svg::band> bands;
};

drawn_series raw_and_smoothed(const std::vector<double>& xs, const std::vector<double>& ys,
                              const std::string& name, const std::string& colour) {
  drawn_series out;
  const size_t n = xs.size();
  const size_t window = smoothing_window(n);
  const std::vector<double> smooth = centred_means(ys, window);
  const size_t stride = std::max<size_t>(1, (n + max_points - 1) / max_points);
  svg::series mean{name + ", mean of " + std::to_string(window) + " steps", colour, {}};
  if (stride == 1) {
    svg::series raw{name + " (each step)", colour, {}};
    raw.stroke_width = 1;
    raw.opacity = 0.35;
    for (size_t i = 0; i < n; ++i) raw.points.emplace_back(xs[i], ys[i]);
    out.lines.push_back(std::move(raw));
  } else {
    svg::band range{name + " (range of each " + std::to_string(stride) + " steps)", colour, {}};
    for (size_t i = 0; i < n; i += stride) {
      double lo = INFINITY, hi = -INFINITY, x = 0;
      size_t k = 0;
      for (size_t j = i; j < std::min(n, i + stride); ++j, ++k) {
        x += xs[j];
        if (!std::isfinite(ys[j])) continue;
        lo = std::min(lo, ys[j]);
        hi = std::max(hi, ys[j]);
      }
      if (lo <= hi) range.points.push_back({x / static_cast<double>(k), {lo, hi}});
    }
    out.bands.push_back(std::move(range));
  }
  // The mean is smooth over `window` >= stride steps: every stride-th of it loses nothing.
  for (size_t i = 0; i < n; i += stride) mean.points.emplace_back(xs[i], smooth[i]);
  if (n > 0 && (n - 1) % stride != 0) mean.points.emplace_back(xs[n - 1], smooth[n - 1]);
  out.lines.push_back(std::move(mean));
  return out;
}

const char* const step_axis = "training step (steps)";

std::string loss_chart(const run_facts& f) {
  std::vector<double> xs, ys;
  for (const auto& [step, row] : f.steps) {
    xs.push_back(static_cast<double>(step));
    ys.push_back(row.loss);
  }
  drawn_series d = raw_and_smoothed(xs, ys, "train loss", "#1f77b4");
  svg::series val{"validation loss", "#d62728", {}, true, true};
  for (const auto& [step, v] : f.val_loss) val.points.emplace_back(step, v);
  d.lines.push_back(std::move(val));
  return svg::line_chart("chart-loss", {"Loss by step", step_axis, "loss (nats/token)"}, d.lines,
                         d.bands);
}

std::string throughput_chart(const run_facts& f) {
  std::vector<double> xs, ys;
  for (const auto& [step, row] : f.steps) {
    xs.push_back(static_cast<double>(step));
    ys.push_back(row.tokens_per_s);
  }
  const drawn_series d = raw_and_smoothed(xs, ys, "throughput", "#2ca02c");
  return svg::line_chart("chart-throughput",
                         {"Throughput by step", step_axis, "throughput (tokens/s)"}, d.lines,
                         d.bands);
}

// The phases of every step, stacked as the accounting measured them. Runs of consecutive steps
// share a column when there are more steps than columns; a column is their mean, so that each
// colour's area stays in proportion to its phase's seconds (a spike is spread over its run,
// never dropped or repeated).
std::string phases_chart(const run_facts& f) {
  std::vector<std::string> order = f.phase_order;
  std::stable_sort(order.begin(), order.end(), [](const std::string& a, const std::string& b) {
    return phase_place(a).first < phase_place(b).first;
  });
  std::vector<svg::layer> layers;
  for (const auto& name : order) layers.push_back({name, phase_place(name).second, {}});
  const size_t n = f.steps.size();
  const size_t per_column = std::max<size_t>(1, (n + max_phase_columns - 1) / max_phase_columns);
  std::vector<double> xs;
  auto it = f.steps.begin();
  while (it != f.steps.end()) {
    double x = 0;
    std::vector<double> sums(order.size(), 0.0);
    size_t k = 0;
    for (; k < per_column && it != f.steps.end(); ++k, ++it) {
      x += static_cast<double>(it->first);
      for (const auto& [name, value] : it->second.phases)
        for (size_t i = 0; i < order.size(); ++i)
          if (name == order[i]) sums[i] += value;
    }
    xs.push_back(x / static_cast<double>(k));
    for (size_t i = 0; i < order.size(); ++i)
      layers[i].values.push_back(sums[i] / static_cast<double>(k));
  }
  std::string title = "Where each step's time went (rank-seconds by phase, stacked)";
  if (per_column > 1) title += ", mean of each " + std::to_string(per_column) + " steps";
  return svg::stacked_area_chart("chart-phases", {title, step_axis, "rank-seconds per step (s)"},
                                 xs, layers);
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
  auto recovery_span = [&](const report::recovery& r, bool open) {
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
      "chart-timeline", {"Timeline", "time since the run's first event (s)", ""},
      {"generations", "faults", "recoveries", "ranks lost", "checkpoints"}, 0, end, spans, marks,
      {{"generation", "#2171b5"},
       {"fault / failed checkpoint", "#d62728"},
       {"recovery", "#ff7f0e"},
       {"rank lost", "#9467bd"},
       {"checkpoint committed", "#2ca02c"}});
}

// The value at a dotted path of a config ("model.n_layer"), trying each spelling given in turn
// (config keys have been renamed before): null when none is there.
json config_at(const json& config, std::initializer_list<const char*> paths) {
  for (const char* path : paths) {
    const json* at = &config;
    std::string rest = path;
    while (at && at->is_object()) {
      const auto dot = rest.find('.');
      const auto it = at->find(rest.substr(0, dot));
      at = it == at->end() ? nullptr : &*it;
      if (dot == std::string::npos) break;
      rest = rest.substr(dot + 1);
    }
    if (at && !at->is_null() && !at->is_structured()) return *at;
  }
  return nullptr;
}

std::string words_of(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_number_integer()) return v.dump();
  if (v.is_number()) return svg::number(v.get<double>());
  return "\xE2\x80\x93";
}

std::string utc_time(double unix_ms) {
  const auto t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// "dp 2 x tp 1 x pp 1 x ep 1" of a plan document (strategies::plan_doc), or its own words.
std::string layout_words(const json& plan) {
  if (!plan.is_object()) return "";
  std::string out;
  if (auto it = plan.find("layout"); it != plan.end() && it->is_object()) {
    for (const char* axis : {"dp", "tp", "pp", "ep"})
      if (auto v = count_of(*it, axis))
        out += (out.empty() ? "" : " \xC3\x97 ") + std::string(axis) + " " + std::to_string(*v);
  }
  if (auto z = count_of(plan, "zero"); z && *z > 0) out += ", ZeRO " + std::to_string(*z);
  if (out.empty()) out = text_of(plan, "describe");
  return out;
}

std::string troupe_version() {
  std::string v = TROUPE_VERSION;
  const std::string git = TROUPE_GIT_DESCRIBE;
  if (!git.empty()) v += " (git " + git + ")";
  return v;
}

// What produced the run: its config, layout, the tool's version, when it ran and how it ended.
std::string run_table(const run_facts& f, const json& config_file) {
  // The config the run's last session started with; config.json where no session recorded it.
  const json& cfg = f.config.is_object() ? f.config : config_file;
  const auto at = [&cfg](std::initializer_list<const char*> paths) {
    return words_of(config_at(cfg, paths));
  };
  std::vector<std::pair<std::string, std::string>> rows;
  std::string model = at({"model.n_layer", "model.layers", "layers"}) + " layers, " +
                      at({"model.n_head", "model.heads", "heads"}) + " heads, d_model " +
                      at({"model.d_model", "d_model"}) + ", context " +
                      at({"model.context", "context"}) + " tokens, vocabulary " +
                      at({"model.vocab", "vocab"});
  const json experts = config_at(cfg, {"model.experts", "experts"});
  if (experts.is_number() && experts.get<double>() > 0)
    model += ", " + words_of(experts) + " experts (top-" + at({"model.top_k", "top_k"}) + ")";
  rows.emplace_back("model", model);
  std::string layout = layout_words(f.first_layout);
  const std::string last = layout_words(f.last_layout);
  if (layout.empty()) layout = "\xE2\x80\x93";
  if (!last.empty() && last != layout) layout += "; last generation: " + last;
  rows.emplace_back("layout", layout + " (world " + at({"world"}) + ", spares " +
                                  at({"elastic.spares", "spares"}) + ")");
  rows.emplace_back("learning rate",
                    at({"optim.lr", "lr"}) + " (warmup " +
                        at({"optim.warmup_steps", "warmup_steps"}) + " steps, down to " +
                        at({"optim.min_lr_ratio", "min_lr_ratio"}) + " \xC3\x97 at the end)");
  rows.emplace_back("optimizer", "beta1 " + at({"optim.beta1", "beta1"}) + ", beta2 " +
                                     at({"optim.beta2", "beta2"}) + ", weight decay " +
                                     at({"optim.weight_decay", "weight_decay"}) +
                                     ", gradient clip " + at({"optim.grad_clip", "grad_clip"}));
  rows.emplace_back("batch",
                    at({"batch"}) + " sequences per step, micro-batch " + at({"micro_batch"}));
  rows.emplace_back("data", at({"data", "data.path"}));
  rows.emplace_back("steps configured", at({"steps"}) + " (seed " + at({"seed"}) +
                                            ", checkpoint every " + at({"checkpoint_every"}) +
                                            " steps)");
  rows.emplace_back("troupe", troupe_version() + ", the build that wrote this report");
  const auto start = f.first_start_ms ? f.first_start_ms : f.first_ms;
  rows.emplace_back("started", start ? utc_time(*start) : "\xE2\x80\x93");
  if (f.done) {
    const auto end = f.done->unix_ms;
    rows.emplace_back("ended", end ? utc_time(*end) : "\xE2\x80\x93");
  } else {
    rows.emplace_back("ended", "not recorded (still running, or stopped without ending)");
  }
  if (f.done) {
    // A stop that was asked for is not a failure: 75 (SIGTERM or SIGUSR1, "requeue me") and
    // 130 (Ctrl-C).
    const int code = f.done->event.exit_code;
    const char* how = code == 0     ? "done"
                      : code == 75  ? "stopped on request (SIGTERM or SIGUSR1); --resume goes on"
                      : code == 130 ? "interrupted (Ctrl-C)"
                                    : "failed";
    rows.emplace_back("outcome", std::string(how) + ", exit code " + std::to_string(code));
  } else {
    const auto last_ms = f.last_ms ? utc_time(*f.last_ms) : "\xE2\x80\x93";
    rows.emplace_back("outcome", "no end recorded; the last event was at " + last_ms);
  }
  std::string s = "<table id=\"run\" class=\"facts\">\n<caption>The run</caption>\n";
  for (const auto& [name, value] : rows)
    s += "<tr><th scope=\"row\">" + svg::escape(name) + "</th><td>" + svg::escape(value) +
         "</td></tr>\n";
  return s + "</table>\n";
}

std::string headline_table(const run_facts& f, const std::string& run_dir) {
  std::vector<std::pair<std::string, std::string>> rows;
  const double wall = (f.last_ms.value_or(0) - f.first_ms.value_or(0)) / 1000.0;
  rows.emplace_back("run directory", run_dir);
  if (f.done) {
    rows.emplace_back("status", "finished, exit code " + std::to_string(f.done->event.exit_code) +
                                    ": " + f.done->event.message);
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
    auto g = report::drawable(f.goodput->goodput);
    auto m = report::drawable(f.goodput->mfu);
    rows.emplace_back("goodput", g ? svg::number(*g * 100, 3) + " %" : "\xE2\x80\x93");
    rows.emplace_back("MFU", m ? svg::number(*m * 100, 3) + " %" : "\xE2\x80\x93");
    // Where every rank-second of the job went, as the accounting last counted it.
    if (const json& phases = f.goodput->phases; phases.is_object()) {
      double total = 0;
      std::vector<std::pair<std::string, double>> parts;
      for (const auto& [name, value] : phases.items())
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
  std::string s = "<table id=\"headline\" class=\"facts\">\n<caption>Headline numbers</caption>\n";
  for (const auto& [name, value] : rows)
    s += "<tr><th scope=\"row\">" + svg::escape(name) + "</th><td>" + svg::escape(value) +
         "</td></tr>\n";
  return s + "</table>\n";
}

std::string html(const run_facts& f, const std::string& run_dir, const json& config_file) {
  std::string s =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>troupe "
      "report: " +
      svg::escape(run_dir) +
      "</title>\n<style>\n"
      "body { font-family: sans-serif; margin: 24px; color: #222; background: #fafafa; }\n"
      "h1 { font-size: 22px; }\n"
      "table.facts { border-collapse: collapse; margin-bottom: 24px; background: #fff; "
      "width: 1000px; max-width: 100%; }\n"
      "table.facts th, table.facts td { border: 1px solid #ddd; padding: 4px 10px; "
      "text-align: left; font-size: 14px; }\n"
      "table.facts th { background: #f0f0f0; font-weight: normal; width: 220px; }\n"
      "caption { text-align: left; font-weight: bold; padding: 6px 0; }\n"
      "svg { display: block; margin: 0 0 24px 0; border: 1px solid #ddd; max-width: 100%; "
      "height: auto; }\n"
      "text { font-family: sans-serif; }\n"
      "</style>\n</head>\n<body>\n<h1>troupe report: " +
      svg::escape(run_dir) + "</h1>\n";
  s += run_table(f, config_file);
  s += headline_table(f, run_dir);
  s += loss_chart(f);
  s += throughput_chart(f);
  s += phases_chart(f);
  s += timeline_chart(f);
  if (f.skipped > 0)
    s += "<p class=\"skipped\">" + std::to_string(f.skipped) +
         " line(s) of events.jsonl were not JSON event objects (or held a known event with a "
         "field missing or of the wrong type) and were skipped.</p>\n";
  return s + "</body>\n</html>\n";
}

}  // namespace

std::string report_help() {
  return R"(usage: troupe report [RUN_DIR] [-o FILE]

Writes one self-contained HTML file (inline SVG, no scripts, nothing fetched) about a run,
finished or still running, from RUN_DIR/events.jsonl and RUN_DIR/config.json: what produced it
(model, layout, learning rate, batch, data, troupe's version, start, end and outcome); a table
of headline numbers; loss and validation loss, tokens/s (each step's and a moving mean) and
where each step's time went, by step; and a timeline of generations, faults, recoveries, lost
ranks and checkpoints.

  RUN_DIR            the run directory (default runs/latest)
  -o, --output FILE  where to write it (default RUN_DIR/report.html)

Lines of events.jsonl that are not JSON events, or hold a known event with a field missing or
of the wrong type, are skipped and counted in the report.
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
  const run_facts facts = report::read_events(events);
  // The config as the job wrote it; the report does without it (events carry the same).
  json config_file;
  if (fs::file_size(dir / "config.json", ec) <= (1u << 20) && !ec) {
    std::ifstream in(dir / "config.json", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (report::shallow(text)) config_file = json::parse(text, nullptr, false);
    if (!config_file.is_object()) config_file = json();
  }
  const std::string page = html(facts, run_dir, config_file);

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
