#pragma once
// How the job stops: training reaches its last step (finishing), the user interrupts it, the
// scheduler wants the nodes back (preempting), or a step diverged (a stop, or a rollback that
// opens a generation). A halt stops committing steps and takes effect once no checkpoint is
// in flight. Also the words each end says, since they are what a user reads last.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "actors/coordinator/job/checkpoint_collection.hpp"
#include "actors/coordinator/job/divergence.hpp"
#include "actors/coordinator/job/job_actions.hpp"
#include "actors/coordinator/job/job_params.hpp"

namespace troupe::actors {

/// The job stops committing steps and, once no checkpoint is in flight, ends (or, for a
/// rollback, opens a generation that restores the last committed checkpoint).
struct halt {
  int exit_code = 0;
  bool rollback = false;
  int64_t step = 0;  ///< the step that diverged (or the last committed, interrupted)
  std::string what;  ///< what diverged, with its value
};

class stopping {
 public:
  explicit stopping(const job_params& p);

  /// Whether a halt is pending (no step is committed any more).
  bool halting() const { return halting_.has_value(); }
  const std::optional<halt>& pending() const { return halting_; }
  void request(halt h) { halting_ = std::move(h); }
  /// The pending halt, which is no longer pending.
  halt take();

  /// The scheduler wants the nodes back: the next step checkpoints and is the last.
  bool preempting() const { return preempting_; }
  void preempt() { preempting_ = true; }
  /// The session's last step is committed; its checkpoint and validation are collected.
  bool finishing() const { return finishing_; }
  void finish_training() { finishing_ = true; }

  /// What the job says when halt `h` ends it (or rolls it back) after step `committed`.
  std::string words(const halt& h, int64_t committed, const checkpoint_collection& checkpoints,
                    const divergence& div) const;
  /// The exit code and words of a job that trained to its last step (or exit_after_step)
  /// and collected everything: a failed checkpoint no later one made good is never silent.
  std::pair<int, std::string> end_of_training(int64_t committed,
                                              const checkpoint_collection& checkpoints) const;

 private:
  int64_t steps_ = 0;  // the configured steps; fewer is exit_after_step
  std::optional<halt> halting_;
  bool preempting_ = false;
  bool finishing_ = false;
};

}  // namespace troupe::actors
