#pragma once
// One simulated node: its own CAF actor system (so its own TLS connection to the coordinator,
// as a real process has), a few member actors, and a ticker that sends their heartbeats the
// way a worker's heartbeat thread does (anon_send, every interval). Aggregated, a relay stands
// for the node's agent: the heartbeats go as one node_beats, the votes through the relay.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/wire/messages.hpp"
#include "bench/control_plane/sim_member.hpp"

namespace troupe::bench::control_plane {

struct node_setup {
  int32_t node = 0;
  std::vector<int32_t> members;  ///< member ids this node runs
  std::string coordinator_host;
  uint16_t coordinator_port = 0;
  std::chrono::steady_clock::time_point connect_deadline;
  std::chrono::milliseconds heartbeat_interval{400};
  member_setup member;  ///< the template: id, node and host are filled in per member
  /// Members whose step takes `slowdown` times as long (stragglers).
  std::vector<int32_t> slow_members;
  double slowdown = 1;
  /// Aggregation through the agents: the node's relay carries its members' votes and beats in
  /// bundles and hands out the coordinator's node_commits (actors/agent/node_relay.hpp).
  bool aggregate = false;
  std::chrono::milliseconds vote_window{100};
};

class sim_node {
 public:
  explicit sim_node(node_setup setup);
  ~sim_node();
  sim_node(const sim_node&) = delete;
  sim_node& operator=(const sim_node&) = delete;

  /// Connects to the coordinator (blocking, retried until the deadline) and starts the members.
  /// Returns "" or what went wrong.
  std::string start();
  /// The member is lost: its actor is killed, so the coordinator sees its actor go down, as it
  /// sees a worker's connection close. False if this node does not run it.
  bool kill_member(int32_t member);
  /// The whole node is lost: every member's actor is killed and the connection closed.
  void kill_all();
  int32_t node() const { return setup_.node; }
  const std::vector<int32_t>& members() const { return setup_.members; }

 private:
  node_setup setup_;
  actors::system_config config_;
  std::unique_ptr<caf::actor_system> system_;
  caf::actor coordinator_;
  std::vector<caf::actor> member_actors_;
  caf::actor ticker_;
  caf::actor relay_;
};

}  // namespace troupe::bench::control_plane
