#pragma once
// Who is in the job: the agents and worker processes admitted, the generation number that
// fences off every older message, each member's heartbeat, its place in the current generation
// and its part in forming the next one, and the processes a fault hits. A pure state machine:
// each method takes the time it needs as an argument and appends the actions it decides on.
// Lookups by member id and by rank are indexed, and the counts the coordinator asks for on
// every message are kept as members change, so each message costs O(1) at any job size.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/coordinator/job/job_actions.hpp"
#include "actors/coordinator/job/job_params.hpp"
#include "actors/coordinator/restore_plan.hpp"
#include "actors/wire/messages.hpp"
#include "chaos/fault_spec.hpp"

namespace troupe::actors {

class membership {
 public:
  explicit membership(const job_params& p);

  /// The current generation; 0 while the first one forms.
  uint64_t generation() const { return generation_; }
  /// Opens the first generation, once every first member has joined.
  void open_first_generation() { generation_ = 1; }
  /// Opens the next generation: from now on every message of an older one is stale.
  void next_generation() { ++generation_; }
  /// Takeover: the job's members already reached generation `g` under an earlier coordinator.
  void continue_from_generation(uint64_t g) { generation_ = std::max(generation_, g); }

  /// An agent asks which workers to start. The first `nodes` agents share the job's first
  /// members; a later one must offer workers of its own (agent_hello::slots). Refused, with
  /// the reason in `answer.error`, when it speaks another protocol or the job is over.
  void admit_agent(const agent_hello& h, bool job_over, launch_plan& answer, actions& out);

  /// An agent that ran node `h.node` rejoins: after a takeover, with the members it runs
  /// (nothing new is started); after it was cut off from every coordinator and stopped its
  /// workers, with the members it ran (agent_hello::former_members), and answer.members are
  /// those of them that no live process holds and were not evicted: it starts them again.
  void readmit_agent(const agent_hello& h, bool job_over, launch_plan& answer, actions& out);

  /// A worker process asks to join. Refused (answer.error) when it speaks another protocol,
  /// the job is over, its member id is invalid or already held by a live process; otherwise
  /// admitted, replacing what an earlier process of the same member left. One that joins a
  /// generation already formed waits idle for the next. Returns the member, nullptr if refused.
  member_info* admit(const hello& h, bool forming, bool job_over, logic_time now, welcome& answer,
                     actions& out);

  /// What a lost member held when it was lost.
  struct lost_member {
    int32_t rank;  ///< its rank in the current generation, -1 = a spare
    int32_t node;
  };
  /// Marks a live member lost (rank_lost event); nullopt when it is unknown or lost already.
  std::optional<lost_member> lose(int32_t member, loss_cause cause, const std::string& why,
                                  int64_t committed, actions& out);

  /// A member's heartbeat. One from a process of a member declared lost (a healed partition,
  /// a SIGSTOPped worker that woke up) no longer counts: it is stale, and the process is told
  /// that it was removed (removed_prefix: its agent starts the member again), or, evicted as a
  /// straggler, to go.
  void record_heartbeat(const heartbeat& h, logic_time now, actions& out);
  /// Why a process of `member` may not rejoin in place (job_logic::rejoin_refusal); empty
  /// when the member is live.
  std::string rejoin_refusal(int32_t member) const;
  /// Every live member's heartbeat clock starts again at `now`: the coordinator itself did
  /// not run for a while, so their silence over that time says nothing about them.
  void restart_heartbeat_clocks(logic_time now);
  /// Members silent longer than the heartbeat timeout, each with the words of its loss.
  std::vector<std::pair<int32_t, std::string>> silent(logic_time now) const;
  /// Seconds since each placed rank's last heartbeat (index = rank).
  std::vector<double> heartbeat_ages(logic_time now, int world) const;

  /// The node whose agent was told to start `member`, -1 if no agent was.
  int32_t launched_on(int32_t member) const;
  /// The members the first agents were told to start (0 .. members - 1).
  int expected() const { return expected_; }

  /// Whether `pid` is the process of `member` the job knows (not an earlier one it restarted).
  bool current_process(int32_t member, int32_t pid) const;
  /// The processes a fault hits: a rank's worker (a rank the shrunken world no longer has is
  /// taken modulo the world), or a node's agent and its workers. Empty for other targets.
  std::vector<int32_t> fault_victims(const chaos::fault& f, int world) const;

  /// A message that came too late for its generation (or from a member no longer in the
  /// job): counted, and logged as a stale_message event (the first 16 of each generation).
  void stale(const std::string& what, int32_t member, uint64_t message_generation, actions& out);
  uint64_t stale_messages() const { return stale_; }

  // Forming a generation.
  /// Every live member is aborted and must report its state and reconfigure again.
  void abort_live(const std::string& reason, actions& out);
  /// The first generation: nobody holds state, so nobody needs to report it.
  void all_reported();
  /// A loss in training: every live member's state is known without a report round (a placed
  /// member holds its rank of the generation before at `committed`, a spare holds nothing).
  void assume_reports(int64_t committed);
  /// A member's state report. Returns whether it was new.
  bool report(const state_report& r);
  /// What a member that rejoins a takeover says it holds (the takeover plans from it).
  void set_held(int32_t member, uint64_t generation, int32_t rank, int64_t step);
  /// Places the members of a new generation as the restore plan says; all must reconfigure.
  void place(const restore_plan& plan);
  void mark_reconfigured(int32_t member);
  bool everyone_reported() const { return unreported_ == 0; }
  bool everyone_reconfigured() const { return unreconfigured_ == 0; }
  /// The first live member that has not reported or reconfigured yet, if any.
  const member_info* first_unready() const;

  /// Whether every placed rank runs on one host and asked for no tcp (reconfigure::one_host).
  bool ranks_share_one_host() const;
  /// The end: aborts every live member (unless the job is done) and stops it.
  void stop_all(int exit_code, const std::string& message, actions& out) const;

  /// The member with id `member`, nullptr if none joined. Read-only: the counts below follow
  /// every change, so changes go through this class.
  const member_info* find(int32_t member) const;
  /// The live member holding `rank` in the current generation, -1 if none.
  int32_t member_of_rank(int32_t rank) const;
  int live_count() const { return live_; }
  /// Live members without a rank in the current generation.
  int idle_count() const { return idle_; }
  /// Live members among the first `expected()` (ids 0 .. expected() - 1).
  int live_first_members() const { return live_first_; }
  const std::vector<member_info>& members() const { return members_; }
  std::vector<member_info> live_members() const;

 private:
  int expected_ = 0;  // members at the start, shared by the first agents
  int nodes_ = 1;
  int max_restarts_ = 0;
  std::chrono::milliseconds heartbeat_timeout_;
  std::chrono::milliseconds coordinator_timeout_;
  std::chrono::milliseconds rejoin_timeout_;
  bool relay_ = false;  ///< launch_plan::relay
  uint64_t generation_ = 0;
  std::vector<member_info> members_;
  std::vector<int32_t> agent_pids_;   // by node
  std::vector<int32_t> launched_on_;  // by member: the node told to start it
  int32_t next_member_ = 0;           // the id the next agent's first worker gets
  uint64_t stale_ = 0;
  static constexpr int max_stale_events_per_generation = 16;
  uint64_t stale_logged_generation_ = 0;
  int stale_logged_ = 0;

  member_info* find_mutable(int32_t member);
  // Adds (sign 1) or takes away (sign -1) what `m` contributes to the counts: every change
  // to one member is bracketed by both, a change to all of them ends with recount().
  void count(const member_info& m, int sign);
  void recount();
  std::unordered_map<int32_t, size_t> slot_of_;  // member id -> index in members_
  std::vector<int32_t> member_of_rank_;          // by rank: its live member, -1 if none
  // Of the live members: all, those without a rank, those not reported, not reconfigured,
  // and those among the first expected_.
  int live_ = 0;
  int idle_ = 0;
  int unreported_ = 0;
  int unreconfigured_ = 0;
  int live_first_ = 0;
};

}  // namespace troupe::actors
