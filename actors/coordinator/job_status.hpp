#pragma once
// What the coordinator's tick and the ranks' votes add to the status board
// (monitoring/status_board.hpp) beyond the event stream: the rank table with heartbeat ages and
// straggler scores, each rank's last step time, and the leadership's epoch.

#include <chrono>
#include <cstdint>
#include <optional>

#include "actors/coordinator/job_logic.hpp"
#include "actors/wire/messages.hpp"
#include "monitoring/status_board.hpp"

namespace troupe::actors {

/// The placed ranks of the current generation, as `logic` sees them at `now`; `epoch` is the
/// leadership's (0 without etcd).
void publish_status(monitoring::status_board& board, const job_logic& logic, logic_time now,
                    int64_t epoch);

/// When the tick publishes: publish_status builds a JSON row per rank (13 ms at ten thousand
/// ranks here, an eighth of the supervisor's thread at ten ticks a second), and a reader polls
/// the document about once a second. So at most once per `period`, but at once when what the
/// table shows changed: another generation (its ranks numbered anew), job state or epoch.
class status_publisher {
 public:
  explicit status_publisher(std::chrono::milliseconds period = std::chrono::seconds(1))
      : period_(period) {}
  /// publish_status if it is due at `now`; returns whether it published.
  bool tick(monitoring::status_board& board, const job_logic& logic, logic_time now, int64_t epoch);

 private:
  struct shown {
    uint64_t generation = 0;
    job_state state = job_state::forming;
    int64_t epoch = 0;
    friend bool operator==(const shown&, const shown&) = default;
  };
  std::chrono::milliseconds period_;
  std::optional<logic_time> last_;  // when it last published
  shown shown_;                     // what it published then
};

/// A rank's vote: its compute and communication seconds for the step.
void note_vote(monitoring::status_board& board, const step_done& vote);

}  // namespace troupe::actors
