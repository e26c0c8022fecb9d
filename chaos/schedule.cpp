#include "chaos/schedule.hpp"

#include <signal.h>

#include <utility>

namespace troupe::chaos {

fault_schedule::fault_schedule(std::vector<fault> faults) : faults_(std::move(faults)) {}

step_injection fault_schedule::on_step_begin(int rank, int64_t step, int64_t data_position) const {
  return {slowdown(faults_, rank, step), diverges(faults_, rank, data_position)};
}

std::vector<fault_firing> fault_schedule::take_due(int64_t next_step) {
  std::vector<fault_firing> due;
  for (; next_ < faults_.size() && faults_[next_].step <= next_step; ++next_)
    if (faults_[next_].kind != fault_kind::slow) due.push_back(firing_of(faults_[next_]));
  return due;
}

fault_firing firing_of(const fault& f) {
  fault_firing out;
  out.fault = f;
  if (f.kind == fault_kind::slow || f.kind == fault_kind::diverge) {
    out.what = fault_firing::action::announce;
  } else if (f.target == fault_target::coordinator) {
    out.what = fault_firing::action::kill_coordinator;
    out.signal = SIGKILL;
  } else {
    out.what = fault_firing::action::signal_victims;
    out.signal = f.kind == fault_kind::kill ? SIGKILL : SIGSTOP;
    if (f.kind == fault_kind::stop) out.continue_after = f.duration;
  }
  return out;
}

}  // namespace troupe::chaos
