#pragma once
// When and where the parsed faults of a job fire: the coordinator asks which faults are due as
// a step begins and carries out what each says; a rank asks what to do to its own step.

#include <chrono>
#include <cstdint>
#include <vector>

#include "chaos/fault_spec.hpp"

namespace troupe::chaos {

/// What a rank injects into one of its own steps (the rank-side injection point).
struct step_injection {
  double slowdown = 1.0;  ///< compute takes this many times as long (1 = not slowed)
  bool diverge = false;   ///< report a NaN loss and gradient norm for this step
  friend bool operator==(const step_injection&, const step_injection&) = default;
};

/// What the coordinator does for one fault that is due (the coordinator-side injection point).
struct fault_firing {
  enum class action {
    announce,          ///< only record it: the rank carries it out itself (diverge)
    kill_coordinator,  ///< SIGKILL the coordinator's own process, as if its machine died
    signal_victims,    ///< send `signal` to the fault's victims (job_logic::fault_victims)
  };
  chaos::fault fault;
  action what = action::announce;
  int signal = 0;  ///< signal_victims: SIGKILL or SIGSTOP
  /// signal_victims with SIGSTOP: send SIGCONT this long after; 0 = never.
  std::chrono::milliseconds continue_after{0};
  friend bool operator==(const fault_firing&, const fault_firing&) = default;
};

/// A job's faults in step order, each fired once.
class fault_schedule {
 public:
  fault_schedule() = default;
  /// `faults` as parse_faults returns them: sorted by step.
  explicit fault_schedule(std::vector<fault> faults);

  /// Rank-side hook: what rank `rank` does to step `step`, which trains on the batch at
  /// `data_position` (see slowdown and diverges).
  step_injection on_step_begin(int rank, int64_t step, int64_t data_position) const;

  /// Coordinator-side hook: the faults due now that step `next_step` is about to begin, each
  /// returned once, in order. Slow faults are never returned: the rank slows itself down.
  std::vector<fault_firing> take_due(int64_t next_step);

  /// The faults not yet returned by take_due (slow ones included).
  size_t pending() const { return faults_.size() - next_; }
  const std::vector<fault>& faults() const { return faults_; }

 private:
  std::vector<fault> faults_;
  size_t next_ = 0;
};

/// What the coordinator does for `f` when it is due (slow faults: announce, though take_due
/// skips them).
fault_firing firing_of(const fault& f);

}  // namespace troupe::chaos
