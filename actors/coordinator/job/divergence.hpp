#pragma once
// Divergence: a loss or gradient norm that no healthy step produces is never committed. The
// policy then stops the job or rolls it back to the last committed checkpoint and skips the
// batch that diverged, from now on and in every later session of the run.

#include <cstdint>
#include <string>
#include <vector>

#include "actors/coordinator/job/job_actions.hpp"
#include "actors/coordinator/job/job_params.hpp"

namespace troupe::actors {

/// A loss or norm as a message shows it: "nan", "-inf", "-0.5312".
std::string number_words(double x);
/// Why one rank's vote shows divergence, "" if it does not: a cross-entropy cannot be
/// negative, and neither it nor a gradient norm can be infinite. `loss_sum` is over `tokens`.
std::string vote_divergence(int32_t rank, double loss_sum, int64_t tokens, double grad_norm);
/// Why a step's mean loss shows divergence, "" if it does not.
std::string loss_divergence(double loss);

class divergence {
 public:
  explicit divergence(const job_params& p);

  /// Step `step` diverged (`what`, with its value): rolls back when the policy says so and
  /// rollbacks are left (the batch joins the skipped ones: record_skipped), stops otherwise.
  /// Logs the diverged event. Returns whether it rolls back.
  bool decide(int64_t step, const std::string& what, uint64_t generation, int64_t committed,
              actions& out);
  /// The next plan restores the last committed checkpoint instead of what members hold.
  void arm_rollback() { rollback_ = true; }
  bool rollback_armed() const { return rollback_; }
  /// Whether the plan being made rolls back; disarms it.
  bool take_rollback();

  /// Batches skipped after divergences (this session's and earlier ones'), ascending.
  const std::vector<int64_t>& skipped() const { return skipped_; }
  int rollbacks() const { return rollbacks_; }

  /// What the job says when step `step` diverged and it rolls back to `checkpoint_step`.
  std::string rollback_words(int64_t step, const std::string& what, int64_t checkpoint_step) const;
  /// What the job says when it stops for a diverged step; `checkpoints` names the last
  /// committed checkpoint.
  std::string stop_words(int64_t step, const std::string& what,
                         const std::string& checkpoints) const;

 private:
  std::string policy_;  // stop | rollback
  int max_rollbacks_ = 0;
  std::vector<int64_t> skipped_;
  int rollbacks_ = 0;
  bool rollback_ = false;
};

}  // namespace troupe::actors
