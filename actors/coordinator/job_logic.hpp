#pragma once
// The job supervisor's decisions as a pure state machine: each event (an agent or a worker
// joining, a vote, a lost member, a state report, a clock tick) goes in with the time it
// happened, and the actions to take (messages to send, events to log, a checkpoint to commit,
// the job's end) come out. No sockets, no actors, no clock of its own: job_supervisor.cpp only
// moves messages, timers and signals.
//
// job_logic is the facade over small machines, one concept each (actors/coordinator/job/):
//   membership             agents and workers admitted, heartbeats, losses, the generation
//                          number that fences off older messages, a fault's victims
//   step_commit            the votes of a step, failed votes and their culprits, commits,
//                          validation results
//   checkpoint_collection  shares collected, manifests committed, checkpoints owed
//   generation_plan        each generation's layout, restore plan and reconfigures, and the
//                          record of the recovery that forms it
//   replacements           restarted workers to wait for, growing onto spares, shrinking
//   straggler_response     warn, evict or rebalance a slow rank
//   divergence             a step that must not be committed: stop or roll back
//   stopping               interrupts, preemption, halts and the words of each end
// What is left here is the job's state (forming, training, recovering, done, failed), its
// deadline, and the transitions that involve several machines.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/coordinator/job/checkpoint_collection.hpp"
#include "actors/coordinator/job/divergence.hpp"
#include "actors/coordinator/job/generation_plan.hpp"
#include "actors/coordinator/job/goodput.hpp"
#include "actors/coordinator/job/job_actions.hpp"
#include "actors/coordinator/job/job_params.hpp"
#include "actors/coordinator/job/membership.hpp"
#include "actors/coordinator/job/replacements.hpp"
#include "actors/coordinator/job/step_commit.hpp"
#include "actors/coordinator/job/stopping.hpp"
#include "actors/coordinator/job/straggler_response.hpp"
#include "actors/coordinator/job/takeover_roll.hpp"
#include "actors/coordinator/restore_plan.hpp"
#include "actors/wire/messages.hpp"
#include "chaos/fault_spec.hpp"

namespace troupe::actors {

/// The job supervisor's state and its transitions. Every method takes the time of the event
/// and returns what to do; nothing else changes the world.
class job_logic {
 public:
  explicit job_logic(job_params params, logic_time now);

  /// What a coordinator elected while the job's members still run knows of the job from etcd
  /// (coordinator takeover).
  struct takeover {
    uint64_t generation = 0;                ///< the newest generation the job's state in etcd names
    int64_t committed_step = 0;             ///< the committed step it names
    int64_t checkpoint_step = -1;           ///< the newest committed checkpoint (LATEST), -1 = none
    int64_t epoch = 0;                      ///< this coordinator's leadership epoch
    std::chrono::milliseconds wait{10000};  ///< how long to wait for the members to rejoin
    std::vector<int64_t> skipped_steps;     ///< the batches the job's rollbacks skipped so far
  };
  /// Instead of forming a new job, takes over a running one: its agents and members rejoin
  /// (agent_hello / hello with `rejoin`) and say what they hold. Once every member the
  /// rejoined agents run is back (or at the deadline, with at least --min-ranks of them) a
  /// new generation opens from the newest step any of them applied; a member behind it gets
  /// the state from a peer, and only when no member holds it does the job read a checkpoint.
  /// Called once, before any other event.
  actions take_over(const takeover& t, logic_time now);

  /// An agent asks which workers to start (`answer`, or why not in answer.error).
  actions on_agent_joined(const agent_hello& h, launch_plan& answer);
  actions on_member_joined(const hello& h, logic_time now, welcome& answer);
  /// A live member that took this coordinator for lost (no beat from it for its timeout, with
  /// standby coordinators to turn to) asked it again and was taken back: it dropped its part
  /// of the running generation, which is formed again (its state is kept).
  actions on_member_rejoined(int32_t member, logic_time now);
  actions on_vote(const step_done& vote, logic_time now);
  actions on_shard_written(const shard_written& w, logic_time now);
  /// `now`: when the committer answered (a default-made time changes no clock).
  actions on_checkpoint_committed(const commit_checkpoint& c, const std::string& path,
                                  const std::string& error, logic_time now = {});
  actions on_eval_done(const eval_done& e, logic_time now);
  actions on_member_lost(int32_t member, loss_cause cause, const std::string& why, logic_time now);
  /// The regroup window of the losses before (schedule_regroup) is over: one new generation for
  /// all of them, unless one began meanwhile.
  actions on_regroup(logic_time now);
  /// A worker process ended, as its agent saw it: logged, and its member is lost when it was
  /// the member's current process (not an earlier one that was restarted). A first member
  /// whose process dies before it joined is waited for when its agent restarts it; otherwise
  /// the job forms without it while --min-ranks allows, and fails naming it when not.
  actions on_worker_exited(const worker_exited& w, logic_time now);
  actions on_state_report(const state_report& r, logic_time now);
  actions on_reconfigured(const reconfigured& r, logic_time now);
  /// The committer looked for an intact checkpoint after a rank could not read the one its
  /// generation restored from (fall_back_checkpoint): the job goes back to it and replays, or
  /// fails when none reads back.
  actions on_checkpoint_fallback(const checkpoint_fallback_found& f, logic_time now);
  actions on_heartbeat(const heartbeat& h, logic_time now);
  /// An agent is gone (`why`): it restarts no worker any more.
  actions on_agent_lost(int node, const std::string& why, logic_time now);
  /// Deadlines: forming, heartbeats, the settle window, recovery, the step watchdog. A tick
  /// that comes stall_gap or more after the one before means the coordinator itself did not
  /// run: every member's heartbeat clock restarts (and a recovery's deadline moves by the gap)
  /// instead of the members being evicted for the coordinator's own silence.
  actions on_tick(logic_time now);
  /// The newest such stall of the coordinator not taken yet (0 if none); taking it clears it.
  std::chrono::milliseconds take_stall() { return std::exchange(stall_, {}); }
  /// Ctrl-C / SIGTERM: no step is committed after this; checkpoints already asked for are
  /// committed first (bounded by the step timeout), then the job ends with exit 130.
  actions on_shutdown(logic_time now);
  /// SIGTERM / SIGUSR1 (a scheduler wants the nodes back): the next step is committed with a
  /// checkpoint and is the last; once that checkpoint is committed the job ends with
  /// exit_code::requeue. Outside training (forming, recovering) it ends at once, and --resume
  /// continues from the last committed checkpoint. A job already stopping keeps its exit code.
  actions on_preempt(logic_time now);
  /// The coordinator cannot go on (etcd gone for longer than --etcd-timeout-ms): the job ends
  /// with exit 1 and `why`; members are stopped, committed checkpoints stay.
  actions on_abandon(const std::string& why, logic_time now);

  /// The processes an injected fault hits now (see membership::fault_victims).
  std::vector<int32_t> fault_victims(const chaos::fault& f) const;

  job_state state() const { return state_; }
  /// Whether a takeover still waits for members to rejoin.
  bool taking_over() const { return takeover_ && !takeover_done_; }
  /// Why a member's process that asks to rejoin in place (hello::rejoin) may not: its member
  /// was declared lost meanwhile (removed_prefix, or evicted_prefix for an evicted straggler).
  /// Empty when the member is live: the hello is judged as usual.
  std::string rejoin_refusal(int32_t member) const { return members_.rejoin_refusal(member); }
  uint64_t generation() const { return members_.generation(); }
  int64_t committed() const { return steps_.committed(); }
  int world() const { return generations_.world(); }
  const strategies::layout_plan& plan() const { return generations_.plan(); }
  const std::vector<member_info>& members() const { return members_.members(); }
  /// The member with id `id`, nullptr if none joined.
  const member_info* member(int32_t id) const { return members_.find(id); }
  /// The member holding `rank` in the current generation, -1 if none.
  int32_t member_of_rank(int32_t rank) const { return members_.member_of_rank(rank); }
  /// Seconds since each placed rank's last heartbeat (index = rank).
  std::vector<double> heartbeat_ages(logic_time now) const;
  const std::vector<double>& straggler_scores() const { return stragglers_.scores(); }
  /// Messages of an older generation that were dropped.
  uint64_t stale_messages() const { return members_.stale_messages(); }
  int64_t last_checkpoint_step() const { return checkpoints_.last_step(); }
  /// Whether some rank may still be writing chunks of a checkpoint this job asked for (then
  /// no chunk may be garbage-collected).
  bool checkpoints_in_flight() const { return checkpoints_.in_flight(); }
  const std::string& last_checkpoint_path() const { return checkpoints_.last_path(); }
  /// Batches skipped after divergences (this session's and earlier ones'), ascending.
  const std::vector<int64_t>& skipped_steps() const { return divergence_.skipped(); }
  int rollbacks() const { return divergence_.rollbacks(); }
  /// Whether the job is stopping (a divergence, an interrupt) and commits no further step.
  bool halting() const { return stopping_.halting(); }
  double last_loss() const { return steps_.last_loss(); }
  double last_val_loss() const { return steps_.last_val_loss(); }
  int64_t tokens_trained() const { return steps_.tokens_trained(); }
  /// Where the job's rank-seconds went up to `now` (goodput accounting).
  const goodput_ledger& ledger() const { return ledger_; }
  /// The `goodput` event for the time up to `now`.
  events::goodput goodput_event(logic_time now) const;
  /// Model FLOPs utilisation of the tokens committed so far over `rank_seconds` of the job's
  /// slots at their peak FLOP/s; 0 while the peak is unknown.
  double mfu(double rank_seconds) const;

 private:
  void set_state(job_state s, actions& out, const std::string& why);
  std::string words(const halt& h) const;

  // Recovery (job_logic_recovery.cpp): generations opened, planned and formed.
  /// `counted`: whether it counts toward max_failed_recoveries (a recovery interrupted by more
  /// losses did not fail: the members it waited for are gone).
  void begin_generation(const std::string& reason, logic_time now, actions& out,
                        bool counted = true);
  // Begins one generation for the losses waiting for their regroup, if any (the window is not
  // waited out: the caller found them together).
  void regroup_now(logic_time now, actions& out, bool counted);
  // Whether the next plan needs no state reports: what each member holds is known.
  bool can_plan_without_reports() const;
  // Plans the generation now and puts each member's reconfigure into its abort (the aborts
  // are the send_abort actions of `out` from index `first_abort`).
  void plan_with_aborts(size_t first_abort, logic_time now, actions& out);
  void plan_generation(logic_time now, actions& out);
  // Plans now, or holds the plan while restarted workers are expected (replacement_wait).
  void plan_or_wait(logic_time now, actions& out);
  // A failed vote's settle window is over: its culprits are lost, or everyone starts over.
  void blame_failed_step(logic_time now, actions& out);

  // Training (job_logic.cpp): votes, commits, checkpoints, and how the job ends.
  // Every vote of the pending step is in: decides the step, unless it is a checkpoint step
  // and the previous checkpoint is still in flight (policy wait: the votes are held).
  void votes_complete(logic_time now, actions& out);
  bool previous_checkpoint_blocks(int64_t step) const;
  // The held votes go on once no checkpoint is in flight.
  void release_held_votes(actions& out);
  void all_votes_in(logic_time now, actions& out);
  void handle_stragglers(const std::vector<double>& compute_s, logic_time now, actions& out);
  bool grow_wanted() const;
  void diverged(int64_t step, const std::string& what, logic_time now, actions& out);
  void maybe_halt(logic_time now, bool force, actions& out);
  // Ends the pending halt: finishes the job (true) or arms a rollback (false).
  bool take_halt(actions& out);
  void maybe_finish(actions& out);
  void finish(int exit_code, const std::string& message, actions& out);
  // Forming: the first generation opens once every first member has joined or is known never
  // to join (its process died before it joined, and no agent restarts it).
  void maybe_open_first_generation(logic_time now, actions& out);
  // Takeover: a rejoining member or agent is noted; the new generation opens once every
  // member the agents run is back (or `force`, at the deadline).
  void note_rejoin(const hello& h);
  void maybe_finish_takeover(logic_time now, bool force, actions& out);
  // The first members neither joined nor known gone, and the words naming the missing ones
  // (or only those known gone).
  int first_members_pending() const;
  std::string missing_members(bool gone_only = false) const;
  /// Why the job could not form within --join-timeout-ms: workers that never joined, or
  /// joined workers that never took their place in the first generation.
  std::string forming_timeout_words() const;

  job_params params_;
  membership members_;
  step_commit steps_;
  checkpoint_collection checkpoints_;
  generation_plan generations_;
  replacements replacements_;
  straggler_response stragglers_;
  divergence divergence_;
  stopping stopping_;
  goodput_ledger ledger_;
  job_state state_ = job_state::forming;
  bool ended_ = false;
  // Losses waiting for their regroup (schedule_regroup): the first one's words and how many.
  std::string regroup_reason_;
  int regroup_losses_ = 0;
  logic_time regroup_first_{}, regroup_last_{};  // the first and the newest of those losses
  logic_time deadline_{};                        // forming, recovery, or the step watchdog
  logic_time latest_{};                          // the newest time an event carried
  std::optional<logic_time> last_tick_;
  std::chrono::milliseconds stall_{0};  // the newest stall of the coordinator, until taken
  // First members whose process ended before they joined and that no agent restarts, with
  // how each ended; and the restarts each node's agent has spent on such processes.
  std::map<int32_t, std::string> never_joined_;
  std::map<int32_t, int> prejoin_restarts_;
  // Takeover (take_over): what etcd said, the members the rejoined agents run, the newest
  // generation and each generation's plan that rejoining members named.
  std::optional<takeover> takeover_;
  // The generation whose restore met a damaged checkpoint, while the committer looks for an
  // intact one (0: none).
  uint64_t fallback_generation_ = 0;
  bool takeover_done_ = false;
  takeover_roll takeover_roll_;
  int takeover_agents_ = 0;
  uint64_t takeover_newest_generation_ = 0;
  std::map<uint64_t, strategies::layout_plan> takeover_plans_;
};

}  // namespace troupe::actors
