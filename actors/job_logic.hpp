#pragma once
// The job supervisor's decisions as a pure state machine: each event (a join, a vote, a lost
// member, a state report, a clock tick) goes in with the time it happened, and the actions
// to take (messages to send, events to log, a checkpoint to commit, the job's end) come out.
// No sockets, no actors, no clock of its own: job_supervisor.cpp only moves messages.

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "actors/messages.hpp"
#include "actors/restore_plan.hpp"
#include "actors/straggler_detector.hpp"
#include "checkpoint/checkpoint.hpp"
#include "runtime/config.hpp"
#include "strategies/planner.hpp"
#include "strategies/replan.hpp"

namespace troupe::actors {

/// forming -> training -> recovering -> training ... -> done | failed.
enum class job_state : uint8_t { forming = 0, training = 1, recovering = 2, done = 3, failed = 4 };
const char* to_string(job_state s);

/// Why a member left the job (the `cause` of a rank_lost event).
enum class loss_cause : uint8_t { exit, connection, hang, straggler, error };
const char* to_string(loss_cause c);

/// Whether step `step` writes a checkpoint (or evaluates): every `every` steps (0 = never),
/// and always at the session's last step.
bool checkpoint_due(int64_t step, int64_t total_steps, int every);
bool evaluation_due(int64_t step, int64_t total_steps, int every);

/// What the job supervisor is started with.
struct job_params {
  train_config cfg;
  int64_t start_step = 0;        ///< steps already committed (resume)
  int64_t checkpoint_step = -1;  ///< the newest committed checkpoint (resume), -1 = none
  int members = 0;               ///< worker processes expected at the start (ranks + spares)
  strategies::layout_plan plan;  ///< the plan of the first generation
  strategies::elastic_bounds bounds;
  std::chrono::milliseconds form_timeout{60000};
  std::chrono::milliseconds heartbeat_timeout{2000};
  std::chrono::milliseconds settle{500};  ///< a failed vote waits this long for its root cause
  std::string straggler_policy = "warn";  ///< warn | rebalance | evict
  int max_failed_recoveries = 5;          ///< recoveries in a row without a committed step
  /// How long a recovery waits for workers that agents are restarting (a crash with restarts
  /// left), so they take their old places in one generation instead of a shrink and a grow.
  /// 0 = never wait. Only with max_restarts > 0.
  std::chrono::milliseconds replacement_wait{0};
  int max_restarts = 0;  ///< each agent's restart budget, as the agents were told
  /// Batches skipped after divergences in earlier sessions of this run (resume), one entry
  /// per skip: see reconfigure::skipped_steps.
  std::vector<int64_t> skipped_steps;
  /// A loss in the middle of training sends each member's place in the next generation with
  /// its abort, without waiting for state reports (see abort_generation::then).
  bool plan_with_abort = true;
  /// Such a plan for plain data parallelism on one host keeps the ranks' shared-memory group
  /// of before, shrunk to the ranks that are left, instead of connecting a new one (see
  /// reconfigure::shrink_kept).
  bool shrink_groups = true;
};

/// Exit codes of a job, as `troupe run` and `troupe coordinator` return them.
namespace exit_code {
inline constexpr int done = 0;
inline constexpr int failed = 1;
inline constexpr int diverged = 3;           ///< a step diverged (policy stop, or rollbacks spent)
inline constexpr int checkpoint_failed = 4;  ///< trained, but a checkpoint failed, none later
/// Stopped early for a scheduler (SIGTERM, SIGUSR1) with a checkpoint of the last committed
/// step: requeue the job, and --resume continues exactly. EX_TEMPFAIL of sysexits.h; every
/// other code means "do not requeue".
inline constexpr int requeue = 75;
inline constexpr int interrupted = 130;
}  // namespace exit_code

// Actions. Members are worker processes by identity; `rank` is their place in a generation.
struct send_commit {
  int32_t member;
  commit msg;
};
struct send_abort {
  int32_t member;
  abort_generation msg;
};
struct send_reconfigure {
  int32_t member;
  reconfigure msg;
};
struct send_stop {
  int32_t member;
};
struct emit_event {
  nlohmann::json event;
};
/// Write the manifest of a checkpoint whose pieces are all durable; answer with
/// on_checkpoint_committed.
struct commit_checkpoint {
  int64_t step = 0;
  int world = 0;
  std::vector<ckpt::saved_piece> pieces;
  int64_t adam_t = 0;
  uint64_t bytes_written = 0;          ///< summed over the ranks
  uint64_t bytes_deduplicated = 0;     ///< summed over the ranks
  double stall_s = 0;                  ///< the longest stall of a rank
  double write_s = 0;                  ///< the longest background write of a rank
  uint64_t snapshot_buffer_bytes = 0;  ///< the ranks' snapshot buffers, summed
  uint64_t replicated_bytes = 0;       ///< chunk bytes also held in peers' memory
  /// The step of the checkpoint a lost generation abandoned that this one replaces, -1 if none.
  int64_t replaces = -1;
};
struct finish_job {
  int exit_code;
  std::string message;
};
/// Store the run's list of skipped batches (all of it, ascending) where a resumed session
/// finds it: a rollback after a divergence added one.
struct record_skipped {
  std::vector<int64_t> steps;
};
using action = std::variant<send_commit, send_abort, send_reconfigure, send_stop, emit_event,
                            commit_checkpoint, finish_job, record_skipped>;
using actions = std::vector<action>;

/// The job supervisor's state and its transitions. Every method takes the time of the event
/// and returns what to do; nothing else changes the world.
class job_logic {
 public:
  explicit job_logic(job_params params, logic_time now);

  actions on_member_joined(const hello& h, logic_time now, welcome& answer);
  actions on_vote(const step_done& vote, logic_time now);
  actions on_shard_written(const shard_written& w, logic_time now);
  actions on_checkpoint_committed(const commit_checkpoint& c, const std::string& path,
                                  const std::string& error);
  actions on_eval_done(const eval_done& e, logic_time now);
  actions on_member_lost(int32_t member, loss_cause cause, const std::string& why, logic_time now);
  actions on_state_report(const state_report& r, logic_time now);
  actions on_reconfigured(const reconfigured& r, logic_time now);
  actions on_heartbeat(const heartbeat& h, logic_time now);
  /// An agent is gone: it restarts no worker any more.
  actions on_agent_lost(int node, logic_time now);
  /// Deadlines: forming, heartbeats, the settle window, recovery, the step watchdog.
  actions on_tick(logic_time now);
  /// Ctrl-C / SIGTERM: no step is committed after this; checkpoints already asked for are
  /// committed first (bounded by the step timeout), then the job ends with exit 130.
  actions on_shutdown(logic_time now);
  /// SIGTERM / SIGUSR1 (a scheduler wants the nodes back): the next step is committed with a
  /// checkpoint and is the last; once that checkpoint is committed the job ends with
  /// exit_code::requeue. Outside training (forming, recovering) it ends at once, and --resume
  /// continues from the last committed checkpoint. A job already stopping keeps its exit code.
  actions on_preempt(logic_time now);

  job_state state() const { return state_; }
  uint64_t generation() const { return generation_; }
  int64_t committed() const { return committed_; }
  int world() const { return plan_.shape.world(); }
  const strategies::layout_plan& plan() const { return plan_; }
  const std::vector<member_info>& members() const { return members_; }
  /// The member holding `rank` in the current generation, -1 if none.
  int32_t member_of_rank(int32_t rank) const;
  /// Seconds since each placed rank's last heartbeat (index = rank).
  std::vector<double> heartbeat_ages(logic_time now) const;
  const std::vector<double>& straggler_scores() const { return stragglers_.scores(); }
  /// Messages of an older generation that were dropped.
  uint64_t stale_messages() const { return stale_; }
  int64_t last_checkpoint_step() const { return checkpoint_step_; }
  /// Whether some rank may still be writing chunks of a checkpoint this job asked for (then
  /// no chunk may be garbage-collected).
  bool checkpoints_in_flight() const { return !collecting_.empty() || committing_ > 0; }
  const std::string& last_checkpoint_path() const { return checkpoint_path_; }
  /// Batches skipped after divergences (this session's and earlier ones'), ascending.
  const std::vector<int64_t>& skipped_steps() const { return skipped_; }
  int rollbacks() const { return rollbacks_; }
  /// Whether the job is stopping (a divergence, an interrupt) and commits no further step.
  bool halting() const { return halting_.has_value(); }
  double last_loss() const { return last_loss_; }
  double last_val_loss() const { return last_val_; }
  int64_t tokens_trained() const { return tokens_trained_; }

 private:
  struct votes {
    int64_t step = -1;
    int count = 0;
    double loss_sum = 0;
    int64_t tokens = 0;
    double lr = 0;
    double compute_s = 0, comm_s = 0, control_s = 0, peer_wait_s = 0;
    std::vector<double> rank_compute_s;
    std::vector<logic_time> arrived;
    std::string diverged;  // why this step diverged, from the first vote that shows it
  };
  // The job stops committing steps and, once no checkpoint is in flight, ends (or, for a
  // rollback, opens a generation that restores the last committed checkpoint).
  struct halt {
    int exit_code = 0;
    bool rollback = false;
    int64_t step = 0;  // the step that diverged (or the last committed, interrupted)
    std::string what;  // what diverged, with its value
  };

  member_info* find(int32_t member);
  int live_count() const;
  void set_state(job_state s, actions& out, const std::string& why);
  void stale(const std::string& what, int32_t member, uint64_t generation, actions& out);
  void begin_generation(const std::string& reason, logic_time now, actions& out);
  // Whether the next plan needs no state reports: what each member holds is known.
  bool can_plan_without_reports() const;
  // Plans the generation now and puts each member's reconfigure into its abort (the aborts
  // are the send_abort actions of `out` from index `first_abort`).
  void plan_with_aborts(size_t first_abort, logic_time now, actions& out);
  void plan_generation(logic_time now, actions& out);
  // The old ranks of the new ones when the plan just made can shrink the previous
  // generation's group (reconfigure::shrink_kept); empty otherwise.
  std::vector<int32_t> shrinkable(const strategies::layout& before, bool before_one_host) const;
  // Plans now, or holds the plan while restarted workers are expected (replacement_wait).
  void plan_or_wait(logic_time now, actions& out);
  int awaited() const;
  // Whether the workers being restarted would let the next plan use more ranks than the
  // live members alone (an idle spare may already take the lost place).
  bool waiting_adds_ranks(int expected) const;
  // Every vote of the pending step is in: decides the step, unless it is a checkpoint step
  // and the previous checkpoint is still in flight (policy wait: the votes are held).
  void votes_complete(logic_time now, actions& out);
  bool previous_checkpoint_blocks(int64_t step) const;
  // The held votes go on once no checkpoint is in flight.
  void release_held_votes(actions& out);
  // Whether committing `step` asks the ranks for a checkpoint: one is due (every
  // checkpoint_every steps and at the session's last step), or one abandoned by a generation
  // that ended is owed, and the step is newer than the last committed checkpoint.
  bool checkpoint_wanted(int64_t step) const;
  // The generation ends with checkpoints still being collected: each is abandoned (what the
  // survivors wrote is not a whole checkpoint), and the next generation owes one in its place.
  void abandon_collections(const std::string& reason, actions& out);
  void all_votes_in(logic_time now, actions& out);
  // A member could not join the generation being formed. When a group could not connect for
  // the same class of reason (reconfigured::error_cause) as in the generation before, which
  // that failure opened, the job ends (true): a retry would fail the same way again.
  bool fails_the_same_way(const reconfigured& r, actions& out);
  void maybe_finish(actions& out);
  void finish(int exit_code, const std::string& message, actions& out);
  void diverged(int64_t step, const std::string& what, logic_time now, actions& out);
  void maybe_halt(logic_time now, bool force, actions& out);
  std::string halt_message(const halt& h) const;
  // Ends the pending halt: finishes the job (true) or arms a rollback (false).
  bool take_halt(actions& out);
  std::string checkpoint_words() const;
  void checkpoint_failed(int64_t step, const std::string& error);
  void handle_stragglers(const std::vector<double>& compute_s, logic_time now, actions& out);
  bool grow_wanted() const;
  // Whether every placed rank runs on one host and asked for no tcp (reconfigure::one_host).
  bool ranks_share_one_host() const;

  job_params params_;
  job_state state_ = job_state::forming;
  uint64_t generation_ = 0;
  bool training_announced_ = false;  // training_started was emitted
  strategies::layout_plan plan_;
  std::map<uint64_t, strategies::layout_plan> plans_;  // generation -> plan, for held state
  std::vector<member_info> members_;
  int64_t committed_ = 0;
  votes pending_;
  // checkpoints being collected (of the current generation), by step: with asynchronous
  // writes the next one may be asked for before the last has every report
  struct collection {
    commit_checkpoint commit;
    std::vector<bool> reported;  // by rank
    int in = 0;
    bool ok = true;
    bool skipped = false;
    std::string error;  // the first rank's
    int failed = 0;
  };
  // A checkpoint that a generation abandoned when it ended (a member was lost while its
  // shares were being collected) is owed: the first step at or after `from` that the job
  // commits takes one in its place, so a loss never costs a whole checkpoint interval.
  struct owed_checkpoint {
    int64_t from = 0;      // the first step that may take it
    int64_t replaces = 0;  // the step of the abandoned checkpoint
  };
  std::optional<owed_checkpoint> owed_;
  std::map<int64_t, collection> collecting_;
  int committing_ = 0;  // manifests handed to the committer, not yet confirmed
  // At most one checkpoint is in flight job-wide, its commit included: the votes of the next
  // checkpoint step wait here until the previous manifest is committed or given up.
  bool votes_held_ = false;
  void start_collecting(int64_t step);
  int64_t checkpoint_step_ = -1;
  std::string checkpoint_path_;
  // validation being collected
  int64_t eval_step_ = -1;
  double eval_sum_ = 0;
  int64_t eval_batches_ = 0;
  int evals_in_ = 0;
  bool finishing_ = false;  // the last step is committed; collecting its checkpoint/validation
  // failures and recovery
  std::string pending_failure_;
  std::map<int32_t, int32_t> failure_reports_;  // rank -> error kind, for the step that failed
  logic_time settle_deadline_{};
  logic_time deadline_{};  // forming, recovery, or the step watchdog
  logic_time recovery_started_{};
  std::string recovery_reason_;
  std::string recovery_cause_;
  int failed_recoveries_ = 0;
  // The last generation that could not form because a group could not connect.
  struct connect_failure_seen {
    uint64_t generation = 0;
    std::string cause;    // its class: refused, unreachable, timed-out, signature, loopback
    std::string address;  // the peer address it concerns
  };
  std::optional<connect_failure_seen> connect_failed_;
  restore_plan restore_;
  std::map<int32_t, reconfigured> restored_;    // by rank
  std::optional<std::vector<int>> rebalanced_;  // replica micro-batches the next plan must use
  // Workers the next plan waits for, by node: each died with restarts left on its agent.
  std::map<int, int> awaited_;
  std::map<int, int> restarts_used_;  // by node, as predicted from the crashes seen
  std::vector<int> lost_nodes_;
  logic_time replacement_deadline_{};
  bool plan_held_ = false;
  bool planned_with_abort_ = false;  // this generation's plan went out with the aborts
  bool shrunk_ = false;              // and its ranks shrink the group of the one before
  bool one_host_ = false;            // the last plan's reconfigure::one_host
  straggler_detector stragglers_;
  std::vector<bool> flagged_;  // by rank: already reported this generation
  // results
  double last_loss_ = 0;
  double last_val_ = -1;
  int64_t tokens_trained_ = 0;
  logic_time last_commit_{};
  uint64_t stale_ = 0;
  bool ended_ = false;
  bool preempting_ = false;  // on_preempt: the next committed step checkpoints and is the last
  // divergence, interrupts, failed checkpoints
  std::vector<int64_t> skipped_;
  int rollbacks_ = 0;
  bool rollback_ = false;  // the next plan restores the last committed checkpoint
  std::optional<halt> halting_;
  logic_time latest_{};                  // the newest time an event carried
  int64_t failed_checkpoint_step_ = -1;  // a failed checkpoint no later commit made good
  std::string failed_checkpoint_error_;
};

}  // namespace troupe::actors
