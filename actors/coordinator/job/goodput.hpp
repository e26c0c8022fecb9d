#pragma once
// Where the job's time goes: every second of every rank slot the job holds is put in exactly
// one phase, so the phases sum to wall time x slots. A pure ledger fed by job_logic with the
// time of each transition and each commit; the per-step split comes from what the ranks
// measured (their votes) and what the coordinator saw (when each vote arrived).
//
// Within a committed step the interval since the previous commit is split as
//   compute          forward + backward (less the pipeline bubble) and the optimizer update
//   bubble           the layout's pipeline bubble fraction of forward + backward
//   exposed_comm     the gradient reduction and tensor-parallel collectives (none of it is
//                    hidden behind compute: the reduce starts after the backward pass)
//   straggler_wait   each rank's vote waiting at the coordinator for the last one
//   checkpoint_stall training held for the previous step's checkpoint snapshot
//   control          the rest: vote -> commit round trips, validation, data loading
// A step committed again (after a rollback or a replay) goes wholly to `redone`. Outside
// committed steps: `forming` until the first generation trains, `recovery` from a failure to
// the first commit of the generation that replaces it, and `idle` for slots the current
// generation does not use (spares, a lost rank not replaced yet).

#include <array>
#include <cstdint>
#include <string_view>

#include "actors/coordinator/restore_plan.hpp"  // logic_time

namespace troupe::actors {

enum class phase : int {
  compute,
  exposed_comm,
  bubble,
  straggler_wait,
  control,
  checkpoint_stall,
  recovery,
  redone,
  forming,
  idle,
};
inline constexpr int phase_count = 10;
std::string_view phase_name(phase p);

/// Rank-seconds by phase.
struct phase_seconds {
  std::array<double, phase_count> s{};
  double& operator[](phase p) { return s[static_cast<size_t>(p)]; }
  double operator[](phase p) const { return s[static_cast<size_t>(p)]; }
  double total() const;
  phase_seconds& operator+=(const phase_seconds& o);
};

/// What the ranks measured for one step, summed over them.
struct step_measures {
  double compute_s = 0;     ///< forward + backward
  double comm_s = 0;        ///< gradient reduction and model-parallel collectives
  double optim_s = 0;       ///< the previous step's optimizer update
  double ckpt_stall_s = 0;  ///< the previous step's checkpoint snapshot
  double peer_wait_s = 0;   ///< this step's votes waiting for the last one (coordinator's clock)
  /// How long the ranks' collectives waited for the slowest rank to arrive: world x the
  /// slowest forward + backward less their sum (data and tensor parallelism, where every rank
  /// computes the same; 0 for pipelines, whose stages differ by design). Taken out of comm_s.
  double collective_skew_s = 0;
  double bubble_fraction = 0;  ///< the layout's pipeline bubble
};

class goodput_ledger {
 public:
  /// `slots`: the rank processes the job holds (its configured world); the ledger grows it
  /// when a generation uses more.
  goodput_ledger(logic_time start, int slots);

  /// The job waits for members (from the start, or a takeover).
  void forming(logic_time now);
  /// A generation with `world` ranks trains (after forming or a recovery).
  void training(logic_time now, int world);
  /// A failure was detected: time from here to the next generation's first commit is recovery.
  void recovering(logic_time now);
  /// Step `step` was committed; returns how its interval was split (the slots the generation
  /// does not use included, as idle). A step not newer than one committed before is redone.
  phase_seconds step_committed(logic_time now, int64_t step, int world, const step_measures& m);
  /// The job ended: the time since the last mark goes to `tail` (the final checkpoint's write,
  /// or the control plane).
  void ended(logic_time now, phase tail);

  /// Totals up to `now`, the time since the last mark included as the current mode's.
  phase_seconds totals(logic_time now) const;
  double wall_s(logic_time now) const;
  int slots() const { return slots_; }
  /// Useful compute over every rank-second so far.
  double goodput(logic_time now) const;

 private:
  enum class mode { forming, training, recovering, ended };
  // The interval since the mark, as the current mode would book it.
  phase_seconds pending(logic_time now) const;
  void book(logic_time now);  // adds pending(now) to the totals and moves the mark

  logic_time start_;
  logic_time mark_;
  mode mode_ = mode::forming;
  int slots_;
  int world_ = 0;
  int64_t newest_step_ = -1;
  phase_seconds totals_;
};

}  // namespace troupe::actors
