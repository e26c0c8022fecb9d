#pragma once
// Checkpoints as the coordinator collects them: which steps ask for one, each rank's share as
// it reports it written, the manifest handed over once every share is durable, and what the
// job owes when a generation ends before a checkpoint is whole. Remembers the last committed
// checkpoint and a failed one no later commit made good. A pure state machine.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/coordinator/job/job_actions.hpp"
#include "actors/coordinator/job/job_params.hpp"
#include "actors/wire/messages.hpp"

namespace troupe::actors {

/// Whether step `step` writes a checkpoint: every `every` steps (0 = never), and always at
/// the session's last step.
bool checkpoint_due(int64_t step, int64_t total_steps, int every);

class checkpoint_collection {
 public:
  explicit checkpoint_collection(const job_params& p);

  /// Whether committing `step` asks the ranks for a checkpoint: one is due (every
  /// checkpoint_every steps and at the session's last step), one abandoned by a generation
  /// that ended is owed, or the scheduler wants the nodes back (`preempting`); and the step
  /// is newer than the last committed checkpoint (a replayed step may already have one).
  bool wanted(int64_t step, bool preempting) const;
  /// Whether some rank may still be writing chunks of a checkpoint this job asked for, or its
  /// manifest is not committed yet.
  bool in_flight() const { return !collecting_.empty() || committing_ > 0; }

  /// Step `step` was committed with a checkpoint: every rank of `world` reports its share.
  void start(int64_t step, int world);
  /// The generation ends (generation `next` opens) with checkpoints still being collected: each
  /// is abandoned, since what the survivors wrote is not a whole checkpoint, and the first step
  /// the job commits from there on owes one in its place.
  void abandon(const std::string& reason, uint64_t next, actions& out);

  /// What one rank's report of its share did.
  enum class share_outcome {
    stale,     ///< not a share this job awaits (another generation, step or rank)
    awaited,   ///< counted; other shares are still to come, or the manifest went out
    given_up,  ///< the last share: the checkpoint failed or was skipped
  };
  /// A rank's share of a checkpoint of generation `generation` (whose world is `world`). The
  /// last one hands the manifest over (commit_checkpoint) unless a share failed or was skipped.
  share_outcome add_share(const shard_written& w, uint64_t generation, int world, actions& out);
  /// The committer wrote a manifest (or could not: `error`).
  void committed(const commit_checkpoint& c, const std::string& path, const std::string& error,
                 uint64_t generation, actions& out);

  /// The newest committed checkpoint did not read back; `step` (at `path`) is the newest
  /// that does, and the one restores come from now.
  void fell_back(int64_t step, const std::string& path) {
    checkpoint_step_ = step;
    checkpoint_path_ = path;
  }
  /// The newest committed checkpoint's step, -1 = none.
  int64_t last_step() const { return checkpoint_step_; }
  const std::string& last_path() const { return checkpoint_path_; }
  /// "the last committed checkpoint is step S (PATH)", or that there is none.
  std::string words() const;
  /// A failed checkpoint that no later commit made good, -1 = none.
  int64_t failed_step() const { return failed_step_; }
  const std::string& failed_error() const { return failed_error_; }

 private:
  // A checkpoint being collected, by step: with asynchronous writes the next one may be
  // asked for before the last has every report.
  struct collection {
    commit_checkpoint commit;
    std::vector<bool> reported;  // by rank
    int in = 0;
    int written = 0;  // shares of ok ranks: only theirs carry an optimizer step to compare
    bool ok = true;
    bool skipped = false;
    std::string error;  // the first rank's
    int failed = 0;
  };
  // A checkpoint that a generation abandoned when it ended (a member was lost while its
  // shares were being collected) is owed: the first step at or after `from` that the job
  // commits takes one in its place, so a loss never costs a whole checkpoint interval.
  struct owed_checkpoint {
    int64_t from = 0;      // the first step that may take it
    int64_t replaces = 0;  // the step of the abandoned checkpoint
  };
  void failed(int64_t step, const std::string& error);

  int64_t last_step_of_session_ = 0;
  int every_ = 0;
  std::map<int64_t, collection> collecting_;
  int committing_ = 0;  // manifests handed to the committer, not yet confirmed
  std::optional<owed_checkpoint> owed_;
  int64_t checkpoint_step_ = -1;
  std::string checkpoint_path_;
  int64_t failed_step_ = -1;
  std::string failed_error_;
};

}  // namespace troupe::actors
