#include "strategies/pipeline_schedule.hpp"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace troupe::strategies {

pipe_schedule_kind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return pipe_schedule_kind::gpipe;
  if (name == "1f1b") return pipe_schedule_kind::one_f_one_b;
  throw std::invalid_argument("unknown pipeline schedule '" + name + "'; use gpipe or 1f1b");
}

std::vector<std::vector<pipe_op>> make_schedule(pipe_schedule_kind kind, int stages,
                                                int micro_batches) {
  if (stages < 1 || micro_batches < 1)
    throw std::invalid_argument("a pipeline needs at least one stage and one micro-batch");
  std::vector<std::vector<pipe_op>> out(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    auto& prog = out[static_cast<size_t>(s)];
    if (kind == pipe_schedule_kind::gpipe) {
      for (int i = 0; i < micro_batches; ++i) prog.push_back({pipe_pass::forward, i});
      for (int i = micro_batches - 1; i >= 0; --i) prog.push_back({pipe_pass::backward, i});
      continue;
    }
    const int warmup = std::min(stages - s - 1, micro_batches);
    int next_f = 0, next_b = 0;
    for (; next_f < warmup; ++next_f) prog.push_back({pipe_pass::forward, next_f});
    while (next_f < micro_batches) {  // steady state: one forward, one backward
      prog.push_back({pipe_pass::forward, next_f++});
      prog.push_back({pipe_pass::backward, next_b++});
    }
    while (next_b < micro_batches) prog.push_back({pipe_pass::backward, next_b++});
  }
  return out;
}

namespace {

// Ready time of an op given the finish times of what it depends on (or -1 if a dependency
// has not run yet).
struct done_table {
  int stages, micro;
  std::vector<double> f, b;  // finish time, -1 = not yet
  done_table(int p, int m)
      : stages(p), micro(m), f(static_cast<size_t>(p * m), -1), b(static_cast<size_t>(p * m), -1) {}
  double& at(std::vector<double>& v, int s, int i) { return v[static_cast<size_t>(s * micro + i)]; }
  // Earliest start of `op` on stage s, or -1 when a dependency is missing.
  double ready(int s, const pipe_op& op) {
    if (op.pass == pipe_pass::forward) return s == 0 ? 0.0 : at(f, s - 1, op.micro_batch);
    double own_f = at(f, s, op.micro_batch);
    if (own_f < 0) return -1;
    if (s == stages - 1) return own_f;
    double next_b = at(b, s + 1, op.micro_batch);
    return next_b < 0 ? -1 : std::max(own_f, next_b);
  }
};

}  // namespace

std::vector<timed_op> simulate_schedule(const std::vector<std::vector<pipe_op>>& schedule,
                                        double forward_s, double backward_s) {
  const int p = static_cast<int>(schedule.size());
  int m = 0;
  for (const auto& prog : schedule)
    for (const auto& op : prog) m = std::max(m, op.micro_batch + 1);
  done_table done(p, m);
  std::vector<size_t> pc(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0.0);
  std::vector<timed_op> out;
  size_t total = 0;
  for (const auto& prog : schedule) total += prog.size();
  while (out.size() < total) {
    // Run the op that can start earliest among every stage's next op.
    int best = -1;
    double best_start = std::numeric_limits<double>::infinity();
    for (int s = 0; s < p; ++s) {
      const auto& prog = schedule[static_cast<size_t>(s)];
      if (pc[static_cast<size_t>(s)] >= prog.size()) continue;
      double r = done.ready(s, prog[pc[static_cast<size_t>(s)]]);
      if (r < 0) continue;
      double start = std::max(r, free_at[static_cast<size_t>(s)]);
      if (start < best_start) best_start = start, best = s;
    }
    if (best < 0) throw std::invalid_argument("schedule deadlocks: " + check_schedule(schedule));
    const auto& op = schedule[static_cast<size_t>(best)][pc[static_cast<size_t>(best)]++];
    double end = best_start + (op.pass == pipe_pass::forward ? forward_s : backward_s);
    free_at[static_cast<size_t>(best)] = end;
    done.at(op.pass == pipe_pass::forward ? done.f : done.b, best, op.micro_batch) = end;
    out.push_back({best, op, best_start, end});
  }
  return out;
}

std::string check_schedule(const std::vector<std::vector<pipe_op>>& schedule) {
  const int p = static_cast<int>(schedule.size());
  if (p == 0) return "no stages";
  int m = 0;
  for (const auto& prog : schedule)
    for (const auto& op : prog) {
      if (op.micro_batch < 0) return "negative micro-batch";
      m = std::max(m, op.micro_batch + 1);
    }
  for (int s = 0; s < p; ++s) {
    std::vector<int> f(static_cast<size_t>(m), 0), b(static_cast<size_t>(m), 0);
    for (const auto& op : schedule[static_cast<size_t>(s)]) {
      auto i = static_cast<size_t>(op.micro_batch);
      if (op.pass == pipe_pass::forward) {
        ++f[i];
      } else {
        if (f[i] == 0)
          return "stage " + std::to_string(s) + " runs B" + std::to_string(i) + " before F" +
                 std::to_string(i);
        ++b[i];
      }
    }
    for (int i = 0; i < m; ++i)
      if (f[static_cast<size_t>(i)] != 1 || b[static_cast<size_t>(i)] != 1)
        return "stage " + std::to_string(s) + " does not run F" + std::to_string(i) + " and B" +
               std::to_string(i) + " exactly once";
  }
  // Deadlock freedom: execute the programs in dependency order without timing.
  done_table done(p, m);
  std::vector<size_t> pc(static_cast<size_t>(p), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const auto& prog = schedule[static_cast<size_t>(s)];
      while (pc[static_cast<size_t>(s)] < prog.size() &&
             done.ready(s, prog[pc[static_cast<size_t>(s)]]) >= 0) {
        const auto& op = prog[pc[static_cast<size_t>(s)]++];
        done.at(op.pass == pipe_pass::forward ? done.f : done.b, s, op.micro_batch) = 1;
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s)
    if (pc[static_cast<size_t>(s)] < schedule[static_cast<size_t>(s)].size())
      return "deadlock: stage " + std::to_string(s) + " waits forever at op " +
             std::to_string(pc[static_cast<size_t>(s)]);
  return {};
}

std::vector<int> peak_live_activations(const std::vector<std::vector<pipe_op>>& schedule) {
  std::vector<int> out;
  for (const auto& prog : schedule) {
    int live = 0, peak = 0;
    for (const auto& op : prog) {
      live += op.pass == pipe_pass::forward ? 1 : -1;
      peak = std::max(peak, live);
    }
    out.push_back(peak);
  }
  return out;
}

double bubble_fraction(const std::vector<timed_op>& timeline, int stages) {
  if (timeline.empty() || stages < 1) return 0;
  double first = timeline.front().start, last = timeline.front().end, busy = 0;
  for (const auto& t : timeline) {
    first = std::min(first, t.start);
    last = std::max(last, t.end);
    busy += t.end - t.start;
  }
  double span = last - first;
  return span > 0 ? 1.0 - busy / (static_cast<double>(stages) * span) : 0.0;
}

double ideal_bubble(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

std::string chrome_trace_json(const std::vector<timed_op>& timeline) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& t : timeline) {
    bool fwd = t.op.pass == pipe_pass::forward;
    events.push_back({{"name", (fwd ? "F" : "B") + std::to_string(t.op.micro_batch)},
                      {"cat", fwd ? "forward" : "backward"},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", t.stage},
                      {"ts", t.start * 1e6},
                      {"dur", (t.end - t.start) * 1e6},
                      {"args", {{"step", t.step}}}});
  }
  for (int s = 0; s <=
                  [&] {
                    int m = 0;
                    for (auto& t : timeline) m = std::max(m, t.stage);
                    return m;
                  }();
       ++s)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", s},
                      {"args", {{"name", "stage " + std::to_string(s)}}}});
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace troupe::strategies
