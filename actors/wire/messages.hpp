#pragma once
// The control plane's whole vocabulary: every atom and message type that crosses a
// process boundary between the coordinator, agents and ranks, registered in one place.

#include <algorithm>
#include <caf/actor.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/auth/credentials.hpp"

namespace troupe::actors {

/// Bumped whenever a message below changes shape; checked in the hello handshake so a
/// worker built from other sources is refused with a clear error instead of silently
/// receiving empty messages. It lives with the join token (runtime/auth), which names it too,
/// so a token of another build is refused before any connection is made.
constexpr int32_t protocol_version = auth::protocol_version;

/// step_done::error_op of a step that failed in the user's own program (it raised): the job
/// ends with its words instead of redoing a step that would fail the same way.
inline constexpr const char* program_failure_op = "program";

using stop_atom = caf::atom_constant<caf::atom("stop")>;  // orderly stop, from the coordinator
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;  // Ctrl-C at the launcher
/// SIGTERM / SIGUSR1 at the launcher or an agent (a scheduler wants the nodes back): checkpoint
/// the next step, stop, exit 75 (job_logic::on_preempt).
using preempt_atom = caf::atom_constant<caf::atom("preempt")>;
using result_atom = caf::atom_constant<caf::atom("result")>;  // the launcher awaits the job's end
using launch_atom = caf::atom_constant<caf::atom("launch")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using settle_atom = caf::atom_constant<caf::atom("settle")>;    // a failure waits for its cause
using regroup_atom = caf::atom_constant<caf::atom("regroup")>;  // losses together: one generation
using watch_atom = caf::atom_constant<caf::atom("watch")>;  // a stage actor monitors a neighbour
using introduce_atom =
    caf::atom_constant<caf::atom("introduce")>;               // a stage hands the next its actor
using resume_atom = caf::atom_constant<caf::atom("resume")>;  // SIGCONT a stopped process (chaos)
// Coordinator takeover (--coordinators K with --etcd): the election tells a standby's supervisor
// it leads now; a worker's heartbeat thread tells its step loop the coordinator went silent.
using lead_atom = caf::atom_constant<caf::atom("lead")>;
using silent_atom = caf::atom_constant<caf::atom("silent")>;
// The leader's lease lapsed (etcd unreachable, quorum lost): the supervisor decides nothing until
// it leads again (lead_atom) or gives up (pause_atom with the reason: the job ends).
using pause_atom = caf::atom_constant<caf::atom("pause")>;
// Aggregation through the agents (hello::relay): a member tells its node's relay where it
// stands, (relay_placed_atom, member, the actor that takes its commits and the coordinator's
// beats, generation, rank, the coordinator it follows, that leader's epoch); generation 0 and
// rank -1 before its first generation. Sent before the member's first vote of a generation, so
// after a takeover the relay knows the new leader before it carries a vote to it.
using relay_placed_atom = caf::atom_constant<caf::atom("placed")>;

/// CAF 0.17 packs doubles with its own IEEE 754 code (caf/detail/ieee_754.hpp): a NaN arrives
/// as an arbitrary number (often a negative one) and an infinity never leaves, the packing
/// loops forever. A figure that may not be finite (a loss, a norm) therefore travels as 0 with
/// its class in a field beside it: wire_encode before sending, wire_decode on receipt.
enum class value_class : int8_t { finite = 0, nan = 1, plus_inf = 2, minus_inf = 3 };
/// Leaves a finite `x` alone; otherwise sets it to 0. Returns the class of the original value.
int8_t wire_encode(double& x);
/// The value wire_encode took apart (`x` itself for the finite class).
double wire_decode(double x, int8_t value_class);

/// A worker process introduces itself to the coordinator. `member` is the process's identity
/// in the job (its agent's slot); its rank changes from generation to generation.
struct hello {
  int32_t protocol = protocol_version;
  int32_t member = -1;
  int32_t pid = 0;
  std::string host;
  int32_t node = 0;       ///< the agent (node) that started it
  caf::actor control;     ///< receives aborts while the step loop runs (see rank.hpp)
  std::string transport;  ///< comm::transport_identity(): its transport request and host
  /// A running member that lost its coordinator and asks the next leader to take it on
  /// (coordinator takeover): what it holds, so that the new leader plans from it.
  bool rejoin = false;
  int64_t epoch_seen = 0;           ///< the newest leadership epoch it has followed
  uint64_t newest_generation = 0;   ///< the newest generation any message named
  uint64_t held_generation = 0;     ///< the generation whose layout its state is in; 0 = none
  int32_t held_rank = -1;           ///< its rank there
  int64_t held_step = -1;           ///< the committed step its state is at; -1 = none usable
  std::string held_plan_json = {};  ///< strategies::to_json of held_generation's plan
  /// Aggregation through the agents: the node's relay, which carries this member's votes and
  /// heartbeats to the coordinator in bundles (node_votes, node_beats) and hands it the commits
  /// and the coordinator's beats that come to the relay once for the node (node_commit). Null:
  /// the member and the coordinator talk directly.
  caf::actor relay = {};
};

/// The coordinator's answer: the member is admitted (or refused, and why). Its rank and the
/// plan come in a `reconfigure` when the next generation forms.
struct welcome {
  uint64_t generation = 0;
  std::string config_json;  ///< the validated job config (runtime/config.hpp to_json)
  std::string store_host;   ///< key-value store that bootstraps the communicators
  int32_t store_port = 0;
  int32_t heartbeat_interval_ms = 0;
  std::string error;  ///< non-empty: the member is refused (and why)
  int64_t epoch = 0;  ///< the answering coordinator's leadership epoch (0 without etcd)
};

/// How often a member sends its heartbeat (welcome::heartbeat_interval_ms): five beats per
/// timeout, so one late beat never looks like a hang, and at most twenty a second.
inline std::chrono::milliseconds heartbeat_interval(std::chrono::milliseconds heartbeat_timeout) {
  return std::max(std::chrono::milliseconds(50), heartbeat_timeout / 5);
}

/// The start of a refusal (welcome::error, launch_plan::error) from a coordinator that does not
/// lead the job (a standby): the member or agent tries the next coordinator it knows.
inline constexpr std::string_view not_leading_prefix = "not leading: ";

/// Where a rank's state for a new generation comes from.
enum class state_source : int8_t {
  init = 0,        ///< parameters from the seed: the job starts (or replays from step 0)
  checkpoint = 1,  ///< the committed checkpoint at `start_step`, read from disk
  self = 2,        ///< this process already holds it (same coordinates, same step)
  peer = 3,        ///< `source_rank` sends it over the data plane
  none = 4,        ///< a spare: no rank in this generation
};
const char* to_string(state_source s);

/// Opens a generation: this member's rank in it, the whole plan (planned once, by the
/// coordinator), the step training continues after, and where the rank's state comes from.
struct reconfigure {
  uint64_t generation = 0;
  int32_t member = -1;
  int32_t rank = -1;  ///< -1: a spare in this generation
  int32_t world = 0;
  std::string plan_json;   ///< strategies::to_json(layout_plan)
  int64_t start_step = 0;  ///< committed steps; the next step is start_step + 1
  state_source source = state_source::init;
  int32_t source_rank = -1;      ///< for peer: who sends (a rank of this generation)
  std::vector<int32_t> send_to;  ///< ranks this rank sends its state to, in this order
  std::string reason;
  /// Steps whose batch diverged and is skipped, one entry per skip, ascending: step s trains
  /// on data position s - 1 + (entries <= s), so a replay never meets a bad batch again.
  std::vector<int64_t> skipped_steps;
  /// Every rank of this generation runs on one host and none asked for tcp (from the members'
  /// hello): groups connect over shared memory without the ranks asking each other first.
  bool one_host = false;
  /// Not empty: the ranks go on in generation `shrink_from`'s data-parallel group instead of
  /// connecting a new one (comm::communicator::shrink); entry r is the rank there of this
  /// generation's rank r. Said only when every rank of this generation held the same rank of
  /// that one on one host, and both layouts are plain data parallelism.
  std::vector<int32_t> shrink_kept;
  uint64_t shrink_from = 0;
  int64_t epoch = 0;  ///< the sending coordinator's leadership epoch (0 without etcd)
};

/// After an abort: what a member holds, so the coordinator can plan the restore.
struct state_report {
  uint64_t generation = 0;  ///< the generation being formed
  int32_t member = -1;
  uint64_t held_generation = 0;  ///< the generation whose layout the state is in; 0 = none
  int32_t held_rank = -1;        ///< its rank in that generation
  int64_t held_step = -1;        ///< the committed step the state is at; -1 = none usable
};

/// A member finished its part of a reconfigure.
struct reconfigured {
  uint64_t generation = 0;
  int32_t member = -1;
  int32_t rank = -1;
  bool ok = true;
  std::string error;
  uint64_t bytes = 0;         ///< state received (peer) or read (checkpoint)
  double seconds = 0;         ///< building communicators and restoring
  uint64_t memory_bytes = 0;  ///< of `bytes`, read from peers' memory (replicated checkpoints)
  /// Not ok because a group could not connect: the class of that failure and the peer address
  /// it concerns, "<class> <address>" (comm::connect_error::cause(), e.g. "unreachable
  /// 10.1.2.3"); "" for any other failure. A generation that fails to form for the same class
  /// of reason as the one before is not retried (job_logic).
  std::string error_cause;
};
/// reconfigured::error_cause of a rank whose restore found its checkpoint damaged (a chunk or
/// the manifest does not read back): "checkpoint-damaged <step>".
inline constexpr std::string_view damaged_checkpoint_cause = "checkpoint-damaged";

/// Sent by every worker from a thread that compute cannot block, so a hung process (SIGSTOP,
/// a wedged kernel call) is told from a slow one.
struct heartbeat {
  int32_t member = -1;
  uint64_t generation = 0;
  int64_t step = 0;
  /// Connections this member's listeners (its stage actors) have refused so far; the
  /// coordinator exports their sum as troupe_rejected_connections_total{listener="stage"}.
  uint64_t rejected_connections = 0;
  int64_t epoch = 0;  ///< the coordinator's beat: its leadership epoch (0 without etcd)
};

/// An agent offers its node; the coordinator answers with a launch plan: which members
/// (worker processes) to start and which node number the agent is.
struct agent_hello {
  int32_t protocol = protocol_version;
  std::string host;
  int32_t pid = 0;
  int32_t slots = 0;  ///< workers it offers (--ranks K); 0 = its share of the job
  /// An agent whose coordinator was lost asks the next leader to take it on (takeover): its
  /// node, the members it runs (with their processes) and the restarts it has left.
  bool rejoin = false;
  int32_t node = -1;
  std::vector<int32_t> members = {};
  std::vector<int32_t> pids = {};
  int32_t restarts_left = 0;
  int64_t epoch_seen = 0;
  /// A rejoining agent that was cut off from every coordinator and stopped its workers: the
  /// members it ran before (`members` is then empty). The leader hands back those that no
  /// process holds any more, to be started again.
  std::vector<int32_t> former_members = {};
};
struct launch_plan {
  uint64_t generation = 0;
  int32_t node = 0;
  std::vector<int32_t> members;        ///< members this agent must start
  int32_t max_restarts = 0;            ///< times this agent may restart a worker that died
  int32_t coordinator_timeout_ms = 0;  ///< a coordinator silent this long is gone
  std::string error;
  int64_t epoch = 0;  ///< the answering coordinator's leadership epoch (0 without etcd)
  /// With several coordinators, a leader silent this long is looked past: the agent asks for
  /// the leader again (0: not said, the coordinator timeout serves)
  int32_t heartbeat_timeout_ms = 0;
  /// How long an agent cut off from every coordinator keeps looking for the leader to rejoin
  /// the job (--rejoin-timeout-ms); 0 = it exits at once.
  int32_t rejoin_timeout_ms = 0;
  /// --relay: the agent runs a node relay (actors/agent/node_relay.hpp) and its workers vote
  /// and beat through it (TROUPE_NODE_RELAY).
  bool relay = false;
};

/// A rank's vote for one step (stage 3 done: its gradients are all-reduced).
struct step_done {
  uint64_t generation = 0;
  int64_t step = 0;  ///< 1-based number of the step this vote is for
  int32_t rank = 0;
  bool ok = true;
  std::string error;        ///< why not ok
  int32_t error_kind = 0;   ///< comm::comm_errc of a data-plane failure; 0 = not one
  std::string error_op;     ///< the stage of the step that failed ("reduce", "apply", ...)
  std::string error_group;  ///< the communicator group, when the data plane failed
  double loss_sum = 0;      ///< sum of per-token losses over this rank's share
  int64_t tokens = 0;
  double grad_norm = 0;   ///< L2 norm of the gradients this rank holds after the reduce (no
                          ///< collective: a partial figure in sharded layouts); the coordinator
                          ///< checks that it is finite before it commits (divergence)
  int8_t loss_class = 0;  ///< value_class of loss_sum (see wire_encode)
  int8_t grad_norm_class = 0;     ///< value_class of grad_norm
  double lr = 0;                  ///< learning rate this step applies with
  double compute_s = 0;           ///< forward + backward
  double compute_cpu_s = 0;       ///< the same, in the step thread's CPU time: what straggler
                                  ///< verdicts use (wall time counts preemption on a busy host)
  double comm_s = 0;              ///< gradient all-reduce
  double control_s = 0;           ///< previous step's vote-to-commit round trip, less the peer wait
  double peer_wait_s = 0;         ///< previous step's wait, at the coordinator, for the last vote
  double optim_s = 0;             ///< previous step's optimizer update
  double ckpt_stall_s = 0;        ///< previous step's checkpoint snapshot (training held for it)
  int64_t optim_state_bytes = 0;  ///< optimizer state this rank holds, as allocated
  int64_t peak_rss_bytes = 0;     ///< the process's peak resident memory so far
};

/// The coordinator's decision for one step: apply it, and what else to do after.
struct commit {
  uint64_t generation = 0;
  int64_t step = 0;
  bool checkpoint = false;  ///< write this rank's shard after applying
  bool evaluate = false;    ///< compute validation loss after applying
  double peer_wait_s = 0;   ///< how long this rank's vote waited for the last one: time
                            ///< spent on peers (imbalance), not on the control plane
  bool hold = false;        ///< the generation ends after this step (it grows): apply it, then
                            ///< wait for the abort instead of starting a step that would be lost
  int64_t epoch = 0;        ///< the sending coordinator's leadership epoch (0 without etcd)
  double loss = 0;          ///< the job's mean loss of the step (a script prints it as is)
  int8_t loss_class = 0;    ///< wire_encode(loss): a NaN or infinity survives the wire
};

/// The current generation is over: `generation` is the one being formed (or the last one,
/// when the job is stopping). Each rank aborts its communicators, drops its uncommitted step
/// and answers with a state_report, unless the abort carries its place in the next
/// generation already (`then`): the coordinator plans without reports when it knows what
/// every member holds (a loss in the middle of training, nobody awaited, a layout whose update
/// is no collective). A member that finds
/// it does not hold what `then` assumes fails that reconfigure, and the normal round follows.
struct abort_generation {
  uint64_t generation = 0;
  std::string reason;
  bool final = false;             ///< the job is ending: exit instead of reporting
  std::vector<reconfigure> then;  ///< empty, or this member's reconfigure for `generation`
  int64_t epoch = 0;              ///< the sending coordinator's leadership epoch (0 without etcd)
};

/// The reason of a final abort_generation sent to one evicted member (the job goes on): the
/// worker recognises the prefix and exits 0, so that its agent does not restart it.
inline constexpr std::string_view evicted_prefix = "evicted: ";
inline std::string evicted_reason(const std::string& why) {
  return std::string(evicted_prefix) + why + "; the job goes on without this member";
}

/// The start of what a coordinator tells a process of a member it declared lost (it was cut
/// off, or stopped, past the heartbeat timeout) when that process speaks again: in a final
/// abort_generation answering its heartbeat, or in the welcome::error answering its rejoin.
/// The process exits with rejoin_exit_code and its agent starts the member again, as a new
/// process that joins the job at the next generation (the job grows back).
inline constexpr std::string_view removed_prefix = "removed: ";
inline std::string removed_reason(const std::string& why) {
  return std::string(removed_prefix) + why +
         "; its agent starts this member again and it rejoins the job";
}
/// A worker's exit code after removed_prefix: its agent starts the member again (not counted
/// against --max-restarts: the process did not fail).
inline constexpr int rejoin_exit_code = 3;

/// A rank's share of a checkpoint is durable on disk (or was skipped, or failed).
struct shard_written {
  uint64_t generation = 0;
  int64_t step = 0;
  int32_t rank = 0;
  bool ok = true;
  bool skipped = false;  ///< a write was still in flight (checkpoint_overlap = skip)
  std::string error;
  std::string pieces_json;  ///< ckpt::encode_pieces: the boxes written and their chunks
  int64_t adam_t = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_deduplicated = 0;
  double stall_s = 0;             ///< training held for the snapshot
  double write_s = 0;             ///< the background write
  uint64_t buffer_bytes = 0;      ///< memory the rank's snapshot buffer holds
  uint64_t replicated_bytes = 0;  ///< chunk bytes also sent to a peer's memory
  /// A program's job (workload.command): its state's table and extras, which the coordinator
  /// knows only from its ranks (encode_state_table); "" for the built-in GPT.
  std::string state_table_json;
};

/// A rank's part of a validation estimate.
struct eval_done {
  uint64_t generation = 0;
  int64_t step = 0;
  int32_t rank = 0;
  double loss_sum = 0;
  int64_t batches = 0;
  int8_t loss_class = 0;  ///< value_class of loss_sum (see wire_encode)
};

/// Pipeline stage to neighbouring stage (actors/worker/stage.hpp): the output of a pass is ready
/// and on its way through the data plane. A forward notice goes to the next stage (micro-batch
/// `micro_batch`'s activation), a backward notice to the previous one (its gradient); a
/// backward notice also returns a credit: the activation slot that micro-batch held is free.
struct pipe_notice {
  uint64_t generation = 0;
  int64_t step = 0;
  int32_t micro_batch = 0;
  bool backward = false;
  int32_t from_stage = 0;
};

/// Tokens routed to each expert in one step by one ep group (MoE only), sent by the group's
/// ep rank 0 right after its forward/backward; the copies of the group (dp / ep of them)
/// each send their micro-batches' share. Figures are before capacity; `dropped` counts the
/// choices capacity turned away.
struct expert_load_report {
  uint64_t generation = 0;
  int64_t step = 0;  ///< 1-based
  int32_t rank = 0;
  int32_t blocks = 0;            ///< MoE blocks (n_layer)
  int32_t experts = 0;           ///< E
  std::vector<int64_t> tokens;   ///< [blocks * experts], block-major
  std::vector<int64_t> dropped;  ///< [blocks]
};

/// An agent reports that one of its worker processes ended.
struct worker_exited {
  int32_t member = 0;
  int32_t pid = 0;
  int32_t exit_code = 0;  ///< valid when signal == 0
  int32_t signal = 0;     ///< the signal that killed it, or 0
};

/// Aggregation through the agents (hello::relay): a node's relay sends its members' heartbeats
/// of one interval as one message, and their votes for a step as one message once every rank
/// it carries has voted (or its window passed). The coordinator handles each entry as if it
/// had come alone; a bundle longer than max_bundle is refused whole.
struct node_beats {
  std::vector<heartbeat> beats;
};
struct node_votes {
  std::vector<step_done> votes;
};
/// The coordinator's commit for the ranks a relay carries: one message per node instead of one
/// per rank. `members[i]` gets `msg` with `peer_wait_s[i]` as its peer wait.
struct node_commit {
  commit msg;
  std::vector<int32_t> members;
  std::vector<double> peer_wait_s;
};
/// The most entries a node_beats or node_votes may carry: more members than one node runs.
inline constexpr size_t max_bundle = 4096;

/// The job's end, as the launcher (troupe run / troupe coordinator) reports it.
struct job_result {
  int32_t exit_code = 0;  ///< 0 done, 1 failed, 3 diverged, 4 a checkpoint failed, 130 interrupted
  std::string message;
  int64_t steps_done = 0;
  double final_loss = 0;
  double val_loss = -1;
  double tokens_per_s = 0;
  double wall_s = 0;
  std::string last_checkpoint;
  int32_t world = 0;  ///< ranks of the job's last generation (lost ranks shrink it); 0 = none
  std::string goodput_json;  ///< the job's last `goodput` event: where its time went
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, hello& x) {
  return f(caf::meta::type_name("troupe::hello"), x.protocol, x.member, x.pid, x.host, x.node,
           x.control, x.transport, x.rejoin, x.epoch_seen, x.newest_generation, x.held_generation,
           x.held_rank, x.held_step, x.held_plan_json, x.relay);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, welcome& x) {
  return f(caf::meta::type_name("troupe::welcome"), x.generation, x.config_json, x.store_host,
           x.store_port, x.heartbeat_interval_ms, x.error, x.epoch);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reconfigure& x) {
  return f(caf::meta::type_name("troupe::reconfigure"), x.generation, x.member, x.rank, x.world,
           x.plan_json, x.start_step, x.source, x.source_rank, x.send_to, x.reason, x.skipped_steps,
           x.one_host, x.shrink_kept, x.shrink_from, x.epoch);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, state_report& x) {
  return f(caf::meta::type_name("troupe::state_report"), x.generation, x.member, x.held_generation,
           x.held_rank, x.held_step);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reconfigured& x) {
  return f(caf::meta::type_name("troupe::reconfigured"), x.generation, x.member, x.rank, x.ok,
           x.error, x.bytes, x.seconds, x.memory_bytes, x.error_cause);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, heartbeat& x) {
  return f(caf::meta::type_name("troupe::heartbeat"), x.member, x.generation, x.step,
           x.rejected_connections, x.epoch);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, agent_hello& x) {
  return f(caf::meta::type_name("troupe::agent_hello"), x.protocol, x.host, x.pid, x.slots,
           x.rejoin, x.node, x.members, x.pids, x.restarts_left, x.epoch_seen, x.former_members);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, launch_plan& x) {
  return f(caf::meta::type_name("troupe::launch_plan"), x.generation, x.node, x.members,
           x.max_restarts, x.coordinator_timeout_ms, x.error, x.epoch, x.heartbeat_timeout_ms,
           x.rejoin_timeout_ms, x.relay);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_done& x) {
  return f(caf::meta::type_name("troupe::step_done"), x.generation, x.step, x.rank, x.ok, x.error,
           x.error_kind, x.error_op, x.error_group, x.loss_sum, x.tokens, x.lr, x.compute_s,
           x.compute_cpu_s, x.comm_s, x.control_s, x.peer_wait_s, x.optim_s, x.ckpt_stall_s,
           x.optim_state_bytes, x.peak_rss_bytes, x.grad_norm, x.loss_class, x.grad_norm_class);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, commit& x) {
  return f(caf::meta::type_name("troupe::commit"), x.generation, x.step, x.checkpoint, x.evaluate,
           x.peer_wait_s, x.hold, x.epoch, x.loss, x.loss_class);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, abort_generation& x) {
  return f(caf::meta::type_name("troupe::abort_generation"), x.generation, x.reason, x.final,
           x.then, x.epoch);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_written& x) {
  return f(caf::meta::type_name("troupe::shard_written"), x.generation, x.step, x.rank, x.ok,
           x.skipped, x.error, x.pieces_json, x.adam_t, x.bytes_written, x.bytes_deduplicated,
           x.stall_s, x.write_s, x.buffer_bytes, x.replicated_bytes, x.state_table_json);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, eval_done& x) {
  return f(caf::meta::type_name("troupe::eval_done"), x.generation, x.step, x.rank, x.loss_sum,
           x.batches, x.loss_class);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pipe_notice& x) {
  return f(caf::meta::type_name("troupe::pipe_notice"), x.generation, x.step, x.micro_batch,
           x.backward, x.from_stage);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_load_report& x) {
  return f(caf::meta::type_name("troupe::expert_load_report"), x.generation, x.step, x.rank,
           x.blocks, x.experts, x.tokens, x.dropped);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_exited& x) {
  return f(caf::meta::type_name("troupe::worker_exited"), x.member, x.pid, x.exit_code, x.signal);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_beats& x) {
  return f(caf::meta::type_name("troupe::node_beats"), x.beats);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_votes& x) {
  return f(caf::meta::type_name("troupe::node_votes"), x.votes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_commit& x) {
  return f(caf::meta::type_name("troupe::node_commit"), x.msg, x.members, x.peer_wait_s);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, job_result& x) {
  return f(caf::meta::type_name("troupe::job_result"), x.exit_code, x.message, x.steps_done,
           x.final_loss, x.val_loss, x.tokens_per_s, x.wall_s, x.last_checkpoint, x.world,
           x.goodput_json);
}

/// The actor-system config every troupe process uses: registers the message types
/// above (on every node, before the system starts), turns on the middleman's
/// heartbeats so a frozen peer is noticed, and scopes connections to one job.
class system_config : public caf::actor_system_config {
 public:
  system_config();

  /// Loads the middleman. Connections made through actors/wire/connect.hpp are then mutual TLS
  /// when this process holds the job's credentials (actors/wire/tls_transport.hpp).
  system_config& use_network();
};

}  // namespace troupe::actors
