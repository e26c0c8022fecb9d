#include "actors/coordinator/job/divergence.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "monitoring/events/events.hpp"

namespace troupe::actors {

std::string number_words(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

std::string vote_divergence(int32_t rank, double loss_sum, int64_t tokens, double grad_norm) {
  const std::string where = " on rank " + std::to_string(rank);
  const double rank_loss = tokens > 0 ? loss_sum / static_cast<double>(tokens) : loss_sum;
  if (!std::isfinite(loss_sum)) return "loss " + number_words(rank_loss) + where + " (not finite)";
  if (loss_sum < 0)
    return "loss " + number_words(rank_loss) + where + " (a cross-entropy below zero)";
  if (!std::isfinite(grad_norm))
    return "gradient norm " + number_words(grad_norm) + where + " (not finite)";
  return "";
}

std::string loss_divergence(double loss) {
  if (!std::isfinite(loss)) return "loss " + number_words(loss) + " (not finite)";
  if (loss < 0) return "loss " + number_words(loss) + " (a cross-entropy below zero)";
  return "";
}

divergence::divergence(const job_params& p)
    : policy_(p.cfg.on_divergence), max_rollbacks_(p.cfg.max_rollbacks), skipped_(p.skipped_steps) {
  std::sort(skipped_.begin(), skipped_.end());
}

bool divergence::decide(int64_t step, const std::string& what, uint64_t generation,
                        int64_t committed, actions& out) {
  const bool roll = policy_ == "rollback" && rollbacks_ < max_rollbacks_;
  if (roll) {
    ++rollbacks_;
    skipped_.insert(std::upper_bound(skipped_.begin(), skipped_.end(), step), step);
    out.push_back(record_skipped{skipped_});
  }
  out.push_back(emit_event{events::diverged{.step = step,
                                            .generation = generation,
                                            .what = what,
                                            .policy = policy_,
                                            .action = roll ? "rollback" : "stop",
                                            .rollbacks = rollbacks_,
                                            .max_rollbacks = max_rollbacks_,
                                            .committed_step = committed,
                                            .skipped_steps = skipped_}});
  return roll;
}

bool divergence::take_rollback() {
  const bool roll = rollback_;
  rollback_ = false;
  return roll;
}

std::string divergence::rollback_words(int64_t step, const std::string& what,
                                       int64_t checkpoint_step) const {
  const std::string s = std::to_string(step);
  return "step " + s + " diverged (" + what + "); rolling back to " +
         (checkpoint_step >= 0 ? "checkpoint step " + std::to_string(checkpoint_step)
                               : std::string("the start (no checkpoint yet)")) +
         " and skipping the batch of step " + s + " (rollback " + std::to_string(rollbacks_) +
         " of " + std::to_string(max_rollbacks_) + ")";
}

std::string divergence::stop_words(int64_t step, const std::string& what,
                                   const std::string& checkpoints) const {
  return "step " + std::to_string(step) + " diverged: " + what + "; it was not committed; " +
         checkpoints +
         (policy_ == "rollback"
              ? "; " + std::to_string(rollbacks_) + " rollbacks spent (--max-rollbacks " +
                    std::to_string(max_rollbacks_) + ")"
              : "; lower --lr, or pass --on-divergence rollback");
}

}  // namespace troupe::actors
