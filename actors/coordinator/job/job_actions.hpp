#pragma once
// What goes into the job's logic and what comes out: the job's states, why a member leaves,
// the exit codes, and the actions (messages to send, events to log, a checkpoint to commit,
// the job's end) that every machine of actors/coordinator/job/ returns and job_supervisor.cpp
// carries out.

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "actors/wire/messages.hpp"
#include "checkpoint/checkpoint.hpp"
#include "monitoring/events/events.hpp"

namespace troupe::actors {

/// forming -> training -> recovering -> training ... -> done | failed.
enum class job_state : uint8_t { forming = 0, training = 1, recovering = 2, done = 3, failed = 4 };
const char* to_string(job_state s);

/// Why a member left the job (the `cause` of a rank_lost event).
enum class loss_cause : uint8_t { exit, connection, hang, straggler, error };
const char* to_string(loss_cause c);

/// Exit codes of a job, as `troupe run` and `troupe coordinator` return them.
namespace exit_code {
inline constexpr int done = 0;
inline constexpr int failed = 1;
inline constexpr int diverged = 3;           ///< a step diverged (policy stop, or rollbacks spent)
inline constexpr int checkpoint_failed = 4;  ///< trained, but a checkpoint failed, none later
/// Stopped early for a scheduler (SIGTERM, SIGUSR1) with a checkpoint of the last committed
/// step: requeue the job, and --resume continues exactly. EX_TEMPFAIL of sysexits.h; every
/// other code means "do not requeue".
inline constexpr int requeue = 75;
/// One of several coordinators (--coordinators K) stopped without ending the job: it stood by,
/// or lost its leadership; another coordinator goes on with the job.
inline constexpr int not_leading = 76;
inline constexpr int interrupted = 130;
}  // namespace exit_code

// Actions. Members are worker processes by identity; `rank` is their place in a generation.
struct send_commit {
  int32_t member;
  commit msg;
};
struct send_abort {
  int32_t member;
  abort_generation msg;
};
struct send_reconfigure {
  int32_t member;
  reconfigure msg;
};
struct send_stop {
  int32_t member;
};
/// Log an event: the supervisor serialises it once, where it writes events.jsonl, and hands the
/// typed event to the metrics and the console.
struct emit_event {
  events::job_event event;
};
/// Write the manifest of a checkpoint whose pieces are all durable; answer with
/// on_checkpoint_committed.
struct commit_checkpoint {
  int64_t step = 0;
  int world = 0;
  std::vector<ckpt::saved_piece> pieces;
  int64_t adam_t = 0;
  std::string state_table_json;        ///< a program's state table (shard_written), else ""
  uint64_t bytes_written = 0;          ///< summed over the ranks
  uint64_t bytes_deduplicated = 0;     ///< summed over the ranks
  double stall_s = 0;                  ///< the longest stall of a rank
  double write_s = 0;                  ///< the longest background write of a rank
  uint64_t snapshot_buffer_bytes = 0;  ///< the ranks' snapshot buffers, summed
  uint64_t replicated_bytes = 0;       ///< chunk bytes also held in peers' memory
  /// The step of the checkpoint a lost generation abandoned that this one replaces, -1 if none.
  int64_t replaces = -1;
};
struct finish_job {
  int exit_code;
  std::string message;
};
/// Store the run's list of skipped batches (all of it, ascending) where a resumed session
/// finds it: a rollback after a divergence added one.
struct record_skipped {
  std::vector<int64_t> steps;
};
/// The checkpoint a generation restores from did not read back on a rank: find the newest
/// committed checkpoint up to `step` that reads back intact, moving the damaged ones aside
/// (checkpoints/damaged/); answered with on_checkpoint_fallback.
struct fall_back_checkpoint {
  int64_t step = 0;
  std::string error;  ///< what the rank met
};
/// What a fall_back_checkpoint found.
struct checkpoint_fallback_found {
  int64_t damaged = -1;              ///< the step whose checkpoint a rank could not read
  std::optional<int64_t> intact;     ///< the newest committed one up to it that reads back intact
  std::string path;                  ///< intact's directory
  std::string error;                 ///< what is wrong with `damaged`
  std::string quarantined;           ///< where `damaged` was moved ("" if it was not)
  std::vector<int64_t> passed_over;  ///< older committed ones found damaged as well
};

/// Members were lost: call job_logic::on_regroup after `after`, so that losses arriving
/// together (a node, a switch, many connections closing at once) make one new generation
/// instead of one each.
struct schedule_regroup {
  std::chrono::milliseconds after{0};
};

using action = std::variant<send_commit, send_abort, send_reconfigure, send_stop, emit_event,
                            commit_checkpoint, finish_job, record_skipped, fall_back_checkpoint,
                            schedule_regroup>;
using actions = std::vector<action>;

}  // namespace troupe::actors
