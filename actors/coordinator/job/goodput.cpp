#include "actors/coordinator/job/goodput.hpp"

#include <algorithm>

namespace troupe::actors {

namespace {
double seconds(logic_time from, logic_time to) {
  return std::max(0.0, std::chrono::duration<double>(to - from).count());
}
}  // namespace

std::string_view phase_name(phase p) {
  switch (p) {
    case phase::compute:
      return "compute";
    case phase::exposed_comm:
      return "exposed_comm";
    case phase::bubble:
      return "bubble";
    case phase::straggler_wait:
      return "straggler_wait";
    case phase::control:
      return "control";
    case phase::checkpoint_stall:
      return "checkpoint_stall";
    case phase::recovery:
      return "recovery";
    case phase::redone:
      return "redone";
    case phase::forming:
      return "forming";
    case phase::idle:
      return "idle";
  }
  return "control";
}

double phase_seconds::total() const {
  double sum = 0;
  for (double x : s) sum += x;
  return sum;
}

phase_seconds& phase_seconds::operator+=(const phase_seconds& o) {
  for (size_t i = 0; i < s.size(); ++i) s[i] += o.s[i];
  return *this;
}

goodput_ledger::goodput_ledger(logic_time start, int slots)
    : start_(start), mark_(start), slots_(std::max(1, slots)) {}

phase_seconds goodput_ledger::pending(logic_time now) const {
  phase_seconds out;
  const double d = seconds(mark_, now);
  switch (mode_) {
    case mode::forming:
      out[phase::forming] = d * slots_;
      break;
    case mode::recovering:
      out[phase::recovery] = d * slots_;
      break;
    case mode::ended:
      break;
    case mode::training:
      // Not split until the step commits: meanwhile the control plane holds it (a live view
      // between commits shows it there).
      out[phase::control] = d * world_;
      out[phase::idle] = d * (slots_ - world_);
      break;
  }
  return out;
}

void goodput_ledger::book(logic_time now) {
  totals_ += pending(now);
  mark_ = std::max(mark_, now);
}

void goodput_ledger::forming(logic_time now) {
  book(now);
  mode_ = mode::forming;
}

void goodput_ledger::training(logic_time now, int world) {
  slots_ = std::max(slots_, world);
  if (mode_ == mode::recovering) {
    // The recovery lasts until the new generation's first commit: what it took so far is
    // booked (a goodput event follows), the rest comes with that commit.
    book(now);
    world_ = world;
    return;
  }
  book(now);
  mode_ = mode::training;
  world_ = world;
}

void goodput_ledger::recovering(logic_time now) {
  if (mode_ == mode::recovering) return;
  // The interval since the last commit: the step in flight, lost to the failure.
  if (mode_ == mode::training) {
    const double d = seconds(mark_, now);
    totals_[phase::recovery] += d * world_;
    totals_[phase::idle] += d * (slots_ - world_);
    mark_ = std::max(mark_, now);
  } else {
    book(now);
  }
  mode_ = mode::recovering;
}

phase_seconds goodput_ledger::step_committed(logic_time now, int64_t step, int world,
                                             const step_measures& m) {
  slots_ = std::max(slots_, world);
  phase_seconds out;
  const double d = seconds(mark_, now);
  out[phase::idle] = d * (slots_ - world);
  const double ranks_s = d * world;
  if (mode_ == mode::recovering) {
    out[phase::recovery] = ranks_s;
    out[phase::idle] = 0;
    out[phase::recovery] += d * (slots_ - world);
    mode_ = mode::training;
  } else if (step <= newest_step_) {
    out[phase::redone] = ranks_s;
  } else {
    const double bubble = std::clamp(m.bubble_fraction, 0.0, 1.0) * std::max(0.0, m.compute_s);
    out[phase::compute] = std::max(0.0, m.compute_s) - bubble + std::max(0.0, m.optim_s);
    out[phase::bubble] = bubble;
    // A fast rank waits inside the gradient reduction for the slowest to arrive: that wait is
    // the straggler's, the rest of the reduction is exposed communication.
    const double comm = std::max(0.0, m.comm_s);
    const double skew = std::clamp(m.collective_skew_s, 0.0, comm);
    out[phase::exposed_comm] = comm - skew;
    out[phase::straggler_wait] = std::max(0.0, m.peer_wait_s) + skew;
    out[phase::checkpoint_stall] = std::max(0.0, m.ckpt_stall_s);
    double measured = 0;
    for (phase p : {phase::compute, phase::bubble, phase::exposed_comm, phase::straggler_wait,
                    phase::checkpoint_stall})
      measured += out[p];
    if (measured > ranks_s && measured > 0) {
      // The ranks' clocks and the coordinator's do not cut steps at the same instants (the
      // optimizer and snapshot of one step fall in the next interval): scale to fit.
      const double k = ranks_s / measured;
      for (phase p : {phase::compute, phase::bubble, phase::exposed_comm, phase::straggler_wait,
                      phase::checkpoint_stall})
        out[p] *= k;
    } else {
      out[phase::control] = ranks_s - measured;
    }
  }
  world_ = world;
  newest_step_ = std::max(newest_step_, step);
  totals_ += out;
  mark_ = std::max(mark_, now);
  return out;
}

void goodput_ledger::ended(logic_time now, phase tail) {
  if (mode_ == mode::ended) return;
  if (mode_ == mode::training) {
    const double d = seconds(mark_, now);
    totals_[tail] += d * world_;
    totals_[phase::idle] += d * (slots_ - world_);
    mark_ = std::max(mark_, now);
  } else {
    book(now);
  }
  mode_ = mode::ended;
}

phase_seconds goodput_ledger::totals(logic_time now) const {
  phase_seconds out = totals_;
  out += pending(now);
  return out;
}

double goodput_ledger::wall_s(logic_time now) const {
  return seconds(start_, mode_ == mode::ended ? mark_ : now);
}

double goodput_ledger::goodput(logic_time now) const {
  const phase_seconds t = totals(now);
  const double all = t.total();
  return all > 0 ? t[phase::compute] / all : 0;
}

}  // namespace troupe::actors
