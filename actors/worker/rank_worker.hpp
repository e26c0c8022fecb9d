#pragma once
// Inside a worker process (actors/worker/rank.cpp and the files beside it): what the member holds
// across generations, and the steps of its life that live in their own files — entering a
// generation (rank_generation.cpp) and taking checkpoints (rank_checkpoints.cpp). Not an
// interface for anything outside the worker.

#include <caf/all.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "actors/wire/connect.hpp"
#include "actors/wire/leader_search.hpp"
#include "actors/wire/messages.hpp"
#include "actors/worker/checkpoint_replica.hpp"
#include "actors/worker/stage.hpp"
#include "actors/worker/worker_control.hpp"
#include "chaos/schedule.hpp"
#include "checkpoint/async_checkpointer.hpp"
#include "monitoring/log.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/workload/workload.hpp"
#include "strategies/engine.hpp"
#include "strategies/gpt_workload.hpp"
#include "strategies/planner.hpp"

namespace troupe::actors::worker_detail {

using clock_type = std::chrono::steady_clock;

inline double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One generation as this rank sees it: its place, its plan, its part of the workload.
struct generation_context {
  uint64_t generation = 0;
  int32_t rank = -1;
  int32_t world = 0;
  strategies::layout_plan plan;
  std::unique_ptr<workload_generation> work;
  // The built-in GPT's engine under `work`, for what only it has (the pipeline stage link,
  // expert load, pipeline traces, format-1 restores); null for another workload.
  strategies::training_engine* gpt = nullptr;
  std::unique_ptr<stage_link> stage;
  int64_t state_step = -1;  // the committed step the state is at; -1 = unusable
};

// How the step loop of one generation ended.
// coordinator_lost: the coordinator fell silent (the heartbeat thread's silent_atom), or with
// standby coordinators the leader's connection closed; serve() asks for the leader again
// instead of failing.
enum class loop_end { finished, aborted, stopped, failed, coordinator_lost };
struct loop_result {
  loop_end how = loop_end::finished;
  uint64_t next_generation = 0;  // aborted: the generation being formed
  std::string why;
  std::optional<reconfigure> then =
      std::nullopt;  // aborted: this member's place in it, when the abort said
};

struct worker {
  caf::blocking_actor* self = nullptr;
  caf::actor coordinator;
  // Every coordinator of the job; more than one means one leads and the others stand by, and
  // losing the leader is survived (rehome in rank.cpp).
  std::vector<endpoint> coordinators;
  endpoint leader;          // where `coordinator` was reached (its store's host when it binds all)
  size_t leader_index = 0;  // its place in `coordinators`
  int64_t epoch_seen = 0;   // the leader's epoch; mirrored in shared->epoch_seen() for control
  int64_t epoch_warned = -1;  // the older epoch last logged as ignored (logged once each)
  heartbeat_thread* beats = nullptr;
  caf::actor control;
  // --relay: its agent's node relay (TROUPE_NODE_RELAY), which carries its votes and heartbeats
  // to the coordinator and hands it the commits; null = it talks to the coordinator directly.
  caf::actor relay;
  int32_t member = -1;
  size_t unwritten_heap = 0;  // warmed heap that still wants its first write (idle spares)
  std::shared_ptr<worker_shared> shared;
  train_config cfg;
  std::unique_ptr<comm::kv_store> store;
  std::optional<token_dataset> data;
  std::unique_ptr<workload> job;        // what this process trains: the GPT over `data`
  chaos::fault_schedule faults;         // asked at each step what to inject
  std::string advertise = "127.0.0.1";  // this node's address, as peers reach it
  generation_context current;
  std::vector<int64_t> skipped_steps;  // batches skipped after a divergence (reconfigure)
  uint64_t newest_generation = 0;      // the newest generation any message named
  int node = 0;
  bool ha() const { return coordinators.size() > 1; }
  // --replicate-checkpoints: this process's replica server and route (outlives the writer).
  std::unique_ptr<checkpoint_replica> replica;
  // Persists snapshots in the background; made at the first checkpoint, kept (with its
  // snapshot buffer) across generations. Declared last: it finishes its write first.
  std::unique_ptr<ckpt::async_checkpointer> checkpointer;
  monitoring::log_context log_ctx() const {
    return {"rank", current.rank, current.generation, shared ? shared->step().load() : -1};
  }
};

/// Sends `msg` to the coordinator, unless this process has fenced itself (it lost the
/// coordinator, worker_shared::fence): then nothing it says may count, and nothing goes out.
/// Nothing goes out while it looks for a new leader either: the old one would not hear it.
/// A vote goes through the node's relay when there is one.
template <class Message>
void tell_coordinator(worker& w, Message&& msg) {
  if (w.shared->fenced() || w.shared->rehoming()) return;
  if constexpr (std::is_same_v<std::decay_t<Message>, step_done>)
    if (w.relay) return w.self->send(w.relay, std::forward<Message>(msg));
  w.self->send(w.coordinator, std::forward<Message>(msg));
}

/// Tells the node's relay (if any) where this member stands: the votes of a step it waits for,
/// where its commits and the coordinator's beats go (the control actor), and the leader it
/// follows (after a takeover, the relay's way to the new one before any vote needs it).
inline void tell_relay_placed(worker& w, uint64_t generation, int32_t rank) {
  if (w.relay)
    w.self->send(w.relay, relay_placed_atom::value, w.member, w.control, generation, rank,
                 w.coordinator, w.epoch_seen);
}

/// Builds this member's part of generation `r` and restores its state; answers `reconfigured`.
reconfigured enter_generation(worker& w, const reconfigure& r);
/// What this member holds, for the coordinator planning `generation`.
state_report report_for(const worker& w, uint64_t generation);

// Standby coordinators (rank_rehome.cpp).
/// This machine's name, as a hello tells it.
std::string this_host();
std::string endpoint_name(const endpoint& e);
/// "a, b, c"
std::string joined(const std::vector<std::string>& parts);
/// Where the store of the coordinator at `coordinator` is reached, from its welcome.
std::string store_host_of(const welcome& answer, const endpoint& coordinator);
/// How a worker's search for the leader ended.
struct found_leader {
  caf::actor actor;  // the leader that took this member on; invalid when none did
  welcome answer;
  size_t index = 0;                    // its place in the list
  std::optional<wire::give_up> ended;  // why no leader did (actor invalid)
  std::vector<std::string> asked;
  std::string last;  // the last answer that was not a welcome
  std::string said;  // the words of the answer that ended it (refused, told to go)
};
/// Checks a leader's welcome before the search settles on it ("" = take it): a leader whose
/// store cannot be reached is passed over like a silent one.
using admit_leader = std::function<std::string(const welcome&, size_t index)>;
/// Asks the job's coordinators for the one that leads and takes `h` on, as the pure machine of
/// actors/wire/leader_search.hpp says (whom next, pacing, deadline); `connected`, when valid,
/// is a connection to the first one asked, made before.
found_leader search_leader(caf::blocking_actor* self, const std::vector<endpoint>& endpoints,
                           const hello& h, const wire::search_policy& policy,
                           const wire::search_start& start, caf::actor connected,
                           const admit_leader& admit = {});
/// The coordinator was lost (silent, or with standbys its connection closed): keeps what this
/// member holds and asks each coordinator in turn to take it back on, until the coordinator
/// timeout. nullopt: a leader did. Otherwise the exit code of this process: 1 when nobody led
/// in time (the process is fenced), rejoin_exit_code when the leader had removed this member
/// meanwhile (its agent starts it again), 0 when it had evicted it.
std::optional<int> rehome(worker& w, const std::string& why);
/// The exit code of a worker whose coordinator stopped it with `why` (loop_end::stopped).
int exit_code_after_stop(const std::string& why);

/// Sizes the snapshot buffers for this generation's state before its first step.
void prepare_checkpoints(worker& w);
/// Takes this rank's snapshot of committed step `step`; the write reports when durable.
void take_checkpoint(worker& w, int64_t step);

}  // namespace troupe::actors::worker_detail
