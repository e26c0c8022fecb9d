#pragma once
// The votes of one step and what a commit leaves behind: every rank votes for the step it
// computed, and only when every vote is in (and none diverged) is the step committed. A failed
// vote waits a moment for its root cause, then names the ranks at fault. Also the validation
// loss a committed step asks for, summed over the ranks. A pure state machine: time is an
// argument.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "actors/coordinator/job/job_actions.hpp"
#include "actors/coordinator/job/job_params.hpp"
#include "actors/coordinator/restore_plan.hpp"
#include "actors/wire/messages.hpp"

namespace troupe::actors {

/// Whether step `step` evaluates: every `every` steps (0 = never), and always at the
/// session's last step.
bool evaluation_due(int64_t step, int64_t total_steps, int every);

/// The votes of the step being voted on, summed.
struct step_votes {
  int64_t step = -1;
  int count = 0;
  double loss_sum = 0;
  int64_t tokens = 0;
  double lr = 0;
  double compute_s = 0, comm_s = 0, control_s = 0, peer_wait_s = 0;
  double optim_s = 0, ckpt_stall_s = 0;  ///< the previous step's, summed over the ranks
  double max_compute_s = 0;              ///< the slowest rank's forward + backward
  std::vector<double> rank_compute_s;    ///< by rank; NaN = no vote yet
  std::vector<logic_time> arrived;       ///< by rank
  std::string diverged;  ///< why this step diverged, from the first vote that shows it
  /// The step's loss per token.
  double mean_loss() const;
};

class step_commit {
 public:
  step_commit(const job_params& p, logic_time now);

  /// The newest committed step.
  int64_t committed() const { return committed_; }
  /// A new generation continues after `step` (its restore plan's start).
  void restart_from(int64_t step) { committed_ = step; }
  /// Every vote and validation report of the generation that ended is void.
  void new_generation();

  /// A rank's vote that its step went well (a rank of `world` in generation `generation`):
  /// summed, checked for divergence, its memory figures logged: a `memory` event each, or for
  /// more ranks than metrics_rank_labels one `memory_summary` once the step's votes are in.
  void count(const step_done& v, int world, uint64_t generation, logic_time now, actions& out);
  /// A rank's vote that its step failed: the first one starts the settle window.
  void fail(const step_done& v, logic_time now);
  int64_t pending_step() const { return pending_.step; }
  bool all_in(int world) const { return pending_.count == world; }
  /// Hands the complete votes over and starts the next step's.
  step_votes take();
  /// Forgets the votes of the pending step (nothing is committed any more).
  void drop() { pending_ = step_votes{}; }

  /// With checkpoint_overlap wait, complete votes wait here while a checkpoint is in flight.
  void hold() { held_ = true; }
  bool held() const { return held_; }
  void release() { held_ = false; }

  /// Whether a failed vote's settle window is over (no loss arrived to explain it).
  bool failure_settled(logic_time now) const;
  /// What the first failed vote said.
  const std::string& failure() const { return failure_; }
  /// The failure is the user's program's own (it raised): a redo would fail the same way.
  bool failed_in_program() const { return program_failed_; }
  /// The ranks at fault for the failed votes: those whose own collective failed (not because
  /// a peer left or they were aborted); when a collective timed out and none did, the ranks
  /// that did not vote (they hang inside it). Empty: nobody is at fault.
  std::vector<int32_t> culprits(int world) const;

  /// Commits complete votes (their mean loss `loss`): returns the seconds since the last commit.
  double commit(const step_votes& v, double loss, logic_time now);
  /// A generation starts training: the next step is timed from now.
  void restart_clock(logic_time now) { last_commit_ = now; }
  double last_loss() const { return last_loss_; }
  int64_t tokens_trained() const { return tokens_trained_; }

  /// The step just committed evaluates: its ranks' validation reports are summed.
  void expect_validation(int64_t step);
  /// Whether a validation report for `step` is awaited.
  bool awaits_validation(int64_t step) const { return eval_step_ >= 0 && step == eval_step_; }
  bool validating() const { return eval_step_ >= 0; }
  /// A rank's validation report; once all `world` are in, the validation event. Returns
  /// whether that was the last one.
  bool add_validation(const eval_done& e, int world, uint64_t generation, actions& out);
  double last_val_loss() const { return last_val_; }

 private:
  std::chrono::milliseconds settle_;
  int zero_ = 0;
  int rank_labels_ = 64;  // the most ranks that log a memory event each
  int64_t committed_ = 0;
  step_votes pending_;
  // The pending step's memory figures, for its memory_summary (above rank_labels_ ranks).
  std::vector<int64_t> optimizer_state_bytes_, peak_rss_bytes_;
  bool held_ = false;
  // failed votes
  std::string failure_;
  bool program_failed_ = false;
  std::map<int32_t, int32_t> failure_reports_;  // rank -> error kind, for the step that failed
  logic_time settle_deadline_{};
  // commits
  logic_time last_commit_{};
  double last_loss_ = 0;
  int64_t tokens_trained_ = 0;
  // validation being collected
  int64_t eval_step_ = -1;
  double eval_sum_ = 0;
  int64_t eval_batches_ = 0;
  int evals_in_ = 0;
  double last_val_ = -1;
};

}  // namespace troupe::actors
