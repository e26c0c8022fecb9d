#include "actors/coordinator/job/stopping.hpp"

namespace troupe::actors {

stopping::stopping(const job_params& p) : steps_(p.cfg.steps) {}

halt stopping::take() {
  halt h = std::move(*halting_);
  halting_.reset();
  return h;
}

std::string stopping::words(const halt& h, int64_t committed,
                            const checkpoint_collection& checkpoints, const divergence& div) const {
  if (h.exit_code == exit_code::interrupted)
    return "interrupted after step " + std::to_string(committed) + "; " + checkpoints.words();
  if (h.exit_code == exit_code::requeue)
    return "stopped after step " + std::to_string(committed) +
           " for the scheduler (SIGTERM or SIGUSR1); " + checkpoints.words() +
           (checkpoints.last_step() >= 0
                ? "; exit 75: requeue the job, --resume continues from there"
                : "; exit 75: requeue the job (it starts from step 0)");
  if (h.rollback) return div.rollback_words(h.step, h.what, checkpoints.last_step());
  return div.stop_words(h.step, h.what, checkpoints.words());
}

std::pair<int, std::string> stopping::end_of_training(
    int64_t committed, const checkpoint_collection& checkpoints) const {
  const bool early = committed < steps_;
  const int64_t kept = checkpoints.last_step();
  if (checkpoints.failed_step() >= 0) {
    // Never silent: the job trained, but what it says is saved must be what LATEST holds.
    return {
        exit_code::checkpoint_failed,
        (early ? "stopped after step " + std::to_string(committed) + " as asked (exit_after_step)"
               : "trained " + std::to_string(committed) + " steps") +
            ", but the checkpoint of step " + std::to_string(checkpoints.failed_step()) +
            " failed (" + checkpoints.failed_error() + "); " + checkpoints.words() +
            (early ? (kept >= 0 ? "; --resume continues from there"
                                : "; --resume has nothing to continue from")
                   : "")};
  }
  // Only what LATEST holds: the last step's checkpoint may have been skipped (overlap skip).
  return {exit_code::done,
          early ? "stopped after step " + std::to_string(committed) +
                      " as asked (exit_after_step); " +
                      (kept >= 0 ? "--resume continues from checkpoint step " + std::to_string(kept)
                                 : "no checkpoint is committed to resume from")
                : "trained " + std::to_string(committed) + " steps"};
}

}  // namespace troupe::actors
