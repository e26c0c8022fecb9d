#pragma once
// What the coordinator's tick and the ranks' votes add to the status board
// (monitoring/status_board.hpp) beyond the event stream: the rank table with heartbeat ages and
// straggler scores, each rank's last step time, and the leadership's epoch.

#include "actors/coordinator/job_logic.hpp"
#include "actors/wire/messages.hpp"
#include "monitoring/status_board.hpp"

namespace troupe::actors {

/// The placed ranks of the current generation, as `logic` sees them at `now`; `epoch` is the
/// leadership's (0 without etcd).
void publish_status(monitoring::status_board& board, const job_logic& logic, logic_time now,
                    int64_t epoch);

/// A rank's vote: its compute and communication seconds for the step.
void note_vote(monitoring::status_board& board, const step_done& vote);

}  // namespace troupe::actors
