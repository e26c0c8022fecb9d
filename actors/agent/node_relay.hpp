#pragma once
// Aggregation through the agents (hello::relay): the actor that stands between a node's members
// and the coordinator on the node's one connection, so that the coordinator handles a message
// per node where it handled one per rank.
// - Votes: held until every rank the relay carries in the generation has voted for the step
//   (or `vote_window` since the first vote passed, or a vote failed), then sent as one
//   node_votes.
// - Heartbeats: the newest beat of each member is sent once per `beat_interval` as one
//   node_beats.
// - The coordinator's node_commit is handed to each member it names; its beat to every member.
// A member says where it stands with (relay_placed_atom, member, its actor, generation, rank,
// its leader, that leader's epoch) when it says hello and whenever it takes its place in a
// generation.
// The agent runs one when the job asks for it (--relay: launch_plan::relay), as do the
// simulator's nodes (bench/control_plane --aggregate). The coordinator to carry to, and the
// members' heartbeat interval, come as (lead_atom, coordinator, interval in ms, epoch).
// With standby coordinators (--etcd) the leader changes: the relay carries to the leader with
// the newest epoch it has heard of, from that leader (a beat, a commit), from a member taking
// its place (before its first vote of the generation, so no vote goes to the old leader) or
// from its agent, whichever comes first; what an older leader sends it is dropped.

#include <atomic>
#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/stateful_actor.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/wire/messages.hpp"

namespace troupe::actors {

struct relay_setup {
  caf::actor coordinator;
  std::chrono::milliseconds vote_window{100};
  std::chrono::milliseconds beat_interval{400};  ///< welcome::heartbeat_interval_ms
  /// Counted when not null: messages the relay sent to and took from the coordinator.
  std::atomic<uint64_t>* to_coordinator = nullptr;
  std::atomic<uint64_t>* from_coordinator = nullptr;
};

struct relay_state {
  relay_setup setup;
  struct place {
    caf::actor member;
    uint64_t generation = 0;
    int32_t rank = -1;
  };
  std::unordered_map<int32_t, place> placed;                               ///< by member id
  std::map<std::pair<uint64_t, int64_t>, std::vector<step_done>> waiting;  ///< by (gen, step)
  std::map<int32_t, heartbeat> beats;  ///< each member's newest, until the next bundle
  int64_t epoch = 0;                   ///< the leadership epoch of `setup.coordinator`
  static inline const char* name = "node_relay";
};

using relay_actor = caf::stateful_actor<relay_state>;

caf::behavior node_relay(relay_actor* self, relay_setup setup);

}  // namespace troupe::actors
