#pragma once
// What the simulated members saw, shared between their actors (many threads) and the bench's
// main thread: per member its place and last commit, per step when the last vote left and when
// the last commit arrived. Plain atomics: the members write, the main thread polls.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace troupe::bench::control_plane {

/// Nanoseconds on the steady clock; every figure of one run is on this one clock.
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void store_max(std::atomic<int64_t>& slot, int64_t value) {
  int64_t seen = slot.load(std::memory_order_relaxed);
  while (value > seen && !slot.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

struct member_record {
  std::atomic<bool> alive{true};        ///< cleared when the bench kills it or it is stopped
  std::atomic<bool> welcomed{false};    ///< the coordinator answered its hello
  std::atomic<uint64_t> generation{0};  ///< the generation of its newest reconfigure
  std::atomic<int32_t> rank{-1};
  std::atomic<int64_t> placed_ns{0};           ///< when its newest reconfigure arrived
  std::atomic<uint64_t> commit_generation{0};  ///< generation of the last commit it received
  std::atomic<int64_t> commit_step{0};
  std::atomic<int64_t> commit_ns{0};
  std::atomic<bool> kill{false};  ///< the bench asks the process that runs it to kill it
};

struct step_record {
  std::atomic<int64_t> last_vote_ns{0};    ///< the latest vote for this step left a member
  std::atomic<int64_t> last_commit_ns{0};  ///< the latest commit of this step arrived
  std::atomic<int32_t> commits{0};         ///< commits of this step received
  std::atomic<int64_t> last_share_ns{0};   ///< the latest checkpoint share of this step left
};

/// Steers the simulator's processes from the bench's main process.
struct sim_control {
  std::atomic<int32_t> kill_round{0};  ///< bumped after members' `kill` flags are set
  std::atomic<int32_t> quit{0};        ///< the run is over: every process stops its nodes
  std::atomic<int32_t> nodes_connected{0};
  std::atomic<int32_t> nodes_failed{0};
};

/// Lives in one shared anonymous mapping, made before the simulator's processes are forked:
/// CAF numbers the actor systems of one process in a single byte of their node id, so a process
/// holds at most 256 simulated nodes, and larger runs take several processes.
class sim_ledger {
 public:
  /// Maps and initialises a ledger shared with the processes forked after it, for the members
  /// of ids first_member .. first_member + members - 1 (the job's ids below are real workers').
  static std::unique_ptr<sim_ledger, void (*)(sim_ledger*)> create_shared(int members,
                                                                          int64_t steps,
                                                                          int32_t first_member = 0);

  /// The record of the member whose id in the job is `id`.
  member_record& member(int32_t id) { return members_[static_cast<size_t>(id - first_member_)]; }
  /// The record of the `i`th simulated member (id first_member() + i).
  member_record& member_at(size_t i) { return members_[i]; }
  int32_t first_member() const { return first_member_; }
  size_t member_count() const { return member_count_; }
  /// nullptr past the job's last step (a redone step never goes past it).
  step_record* step(int64_t s) {
    return s >= 0 && static_cast<size_t>(s) < step_count_ ? &steps_[static_cast<size_t>(s)]
                                                          : nullptr;
  }
  sim_control& control() { return control_; }

  // Counters, for rates over a window.
  std::atomic<uint64_t> votes_sent{0};
  std::atomic<uint64_t> commits_received{0};
  std::atomic<uint64_t> beats_sent{0};      ///< member -> coordinator heartbeats
  std::atomic<uint64_t> beats_received{0};  ///< coordinator -> member heartbeats
  std::atomic<uint64_t> reconfigures{0};
  std::atomic<uint64_t> aborts{0};
  std::atomic<uint64_t> reports{0};
  std::atomic<uint64_t> refusals{0};        ///< hellos refused or unanswered
  std::atomic<uint64_t> stops{0};           ///< members told to stop (the job's end, an eviction)
  std::atomic<uint64_t> shares_written{0};  ///< checkpoint shares written and reported
  /// Messages on the wire while training, whatever they carry (a node_votes counts once): what
  /// the coordinator's I/O thread handles, apart from the generations' messages.
  std::atomic<uint64_t> messages_to_coordinator{0};
  std::atomic<uint64_t> messages_from_coordinator{0};

 private:
  sim_ledger() = default;
  sim_control control_;
  int32_t first_member_ = 0;
  size_t member_count_ = 0;
  size_t step_count_ = 0;
  size_t mapped_bytes_ = 0;
  member_record* members_ = nullptr;
  step_record* steps_ = nullptr;
};

}  // namespace troupe::bench::control_plane
