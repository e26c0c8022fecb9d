#pragma once
// Where each rank of a new generation gets its state: which member takes which rank, and
// whether its state is kept in place, sent by a peer, or read from the last checkpoint.
// A pure function of what the live members hold (actors/coordinator/job_logic.hpp calls it).

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "actors/wire/messages.hpp"
#include "runtime/config.hpp"
#include "strategies/planner.hpp"

namespace troupe::actors {

using logic_clock = std::chrono::steady_clock;
using logic_time = logic_clock::time_point;

/// One worker process, as the supervisor knows it.
struct member_info {
  int32_t id = -1;
  int32_t node = 0;
  int32_t pid = 0;
  std::string host;
  std::string transport;  ///< hello::transport: "<request>\n<host identity>"
  bool live = true;
  bool evicted = false;          ///< lost as a straggler: told to go, never started again
  int32_t rank = -1;             ///< in the current generation; -1 = spare (or not placed yet)
  uint64_t held_generation = 0;  ///< the generation whose layout its state is in
  int32_t held_rank = -1;
  int64_t held_step = -1;     ///< -1: holds nothing usable
  bool reported = false;      ///< recovering: its state_report is in
  bool reconfigured = false;  ///< recovering: its reconfigured is in
  logic_time last_heartbeat{};
};

/// Where each rank of a new generation gets its state, and which member it is.
struct restore_plan {
  std::vector<int32_t> member_of_rank;  ///< index = rank
  std::vector<state_source> source;     ///< index = rank
  std::vector<int32_t> source_rank;     ///< index = rank; peer only
  int64_t start_step = 0;               ///< the step every rank continues after
};

/// Chooses members for the ranks of `next` and the source of each rank's state: a member whose
/// held state has the same coordinates keeps its place (self); a rank with no such member
/// takes another and receives the state from a rank that has it (peer); when some rank's state
/// is held by no live member at `committed`, every rank restores the checkpoint at
/// `checkpoint_step` (or starts from the seed when there is none) and the job replays from
/// there. `plans` holds the plan of every generation a member may hold state from. Member ids
/// in `live` are distinct. Pure; O(N log N) in ranks and members.
restore_plan plan_restore(const std::vector<member_info>& live,
                          const std::map<uint64_t, strategies::layout_plan>& plans,
                          const strategies::layout_plan& next, int zero, int64_t committed,
                          int64_t checkpoint_step);

/// Index = rank: the ranks that receive their state from it as a peer, ascending
/// (reconfigure::send_to). One pass over the plan.
std::vector<std::vector<int32_t>> peer_receivers(const restore_plan& plan);

}  // namespace troupe::actors
