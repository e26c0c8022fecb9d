#pragma once
// A simulated member: one event-based actor that speaks a worker's side of the control
// protocol (actors/wire/messages.hpp) to the real coordinator, without training or a data
// plane. It says hello, takes its place in each generation, votes every step after a simulated
// compute time, applies commits, reports what it holds after an abort and stops when told.

#include <caf/actor.hpp>
#include <caf/stateful_actor.hpp>
#include <cstdint>
#include <random>
#include <string>

#include "bench/control_plane/sim_ledger.hpp"
#include "bench/control_plane/sim_shares.hpp"

namespace troupe::bench::control_plane {

struct member_setup {
  int32_t id = 0;
  int32_t node = 0;
  std::string host;  ///< "simnode-<node>": no one-host shortcut fires
  caf::actor coordinator;
  caf::actor relay;  ///< its node's relay (actors/agent/node_relay.hpp); null = none
  sim_ledger* ledger = nullptr;
  int step_ms = 200;    ///< simulated forward + backward
  int jitter_ms = 0;    ///< uniform in [-jitter, +jitter]
  double slowdown = 1;  ///< a straggler's factor on step_ms
  int hello_timeout_s = 300;
};

struct member_state {
  member_setup setup;
  uint64_t generation = 0;
  int32_t rank = -1;
  int32_t world = 0;
  int64_t committed = 0;  ///< the newest step it applied
  uint64_t held_generation = 0;
  int32_t held_rank = -1;
  int64_t epoch = 0;
  std::mt19937 rng;
  share_writer* shares = nullptr;  ///< this process's, once welcomed (null: shares fail)
  std::string shares_error;        ///< why there is none
  static inline const char* name = "sim_member";
};

using member_actor = caf::stateful_actor<member_state>;

/// The member's behaviour; it sends its hello at once.
caf::behavior sim_member(member_actor* self, member_setup setup);

/// A pid no process can have (above Linux's PID_MAX_LIMIT), so that nothing the coordinator
/// does with it (a `kill`) reaches a real process.
inline int32_t fake_pid(int32_t member) { return 5'000'000 + member; }

}  // namespace troupe::bench::control_plane
