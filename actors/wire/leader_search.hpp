#pragma once
// Finding the leader among a job's coordinators, as one pure machine that the worker (start-up,
// rehoming) and the agent (start-up, rehoming, rejoining after a cut) drive alike. It owns the
// decisions that used to be written once per caller: which coordinator to ask next (round robin
// from the last known leader, or the one a standby names), what each answer means, how long to
// pause between tries and when to stop. It owns nothing else: no actor, socket, thread or clock.
// The caller passes the time in, performs the action it gets back (connect and say hello, sleep
// or schedule a timer, give up, follow the leader), and reports the answer. Depends only on the
// standard library, so that it is tested without a network and used from any process.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace troupe::actors::wire {

using search_clock = std::chrono::steady_clock;
using search_time = search_clock::time_point;

/// What one try at a coordinator came to, as the caller saw it (the machine may judge a leader's
/// answer stale on top, see leader_search_machine::on_answer).
enum class verdict : uint8_t {
  welcomed,            ///< it leads and took this process on
  not_leading,         ///< a standby (or a deposed leader that knows it): ask the next one
  stale,               ///< it leads an epoch older than one already seen: ask the next one
  refused,             ///< it leads and turned this process away (protocol, job over, ...)
  told_to_go,          ///< it leads and removed or evicted this process while it was away
  other_job,           ///< the address answers for another job (its join token differs)
  connection_refused,  ///< nothing listens at the address: the process there is gone
  no_answer,           ///< no connection or no answer in time, or the connection closed
};
const char* to_string(verdict v);

/// Why a search ended without a leader.
enum class give_up_reason : uint8_t {
  deadline,        ///< nobody took this process on before the deadline
  refused,         ///< a leader turned it away (search_policy::stop_on_refusal)
  told_to_go,      ///< a leader removed or evicted it: the process must go
  other_job,       ///< an endpoint belongs to another job (search_policy::stop_on_other_job)
  nobody_listens,  ///< the only coordinator refuses connections (lone_refusal_is_final)
  no_endpoints,    ///< the list of coordinators is empty
};
const char* to_string(give_up_reason r);

/// When the search pauses between failed tries.
enum class pacing : uint8_t {
  after_each_try,    ///< after every failed try (what every caller did before this machine)
  after_each_round,  ///< only once every endpoint failed in turn: a round is asked back to back
};
const char* to_string(pacing p);

/// How a search paces itself and which answers end it. Every field has a caller behind it:
/// the presets below are today's values.
struct search_policy {
  /// The most a connection attempt may take, and its floor when the deadline is nearer: a
  /// dead coordinator must not eat the window the live ones need.
  std::chrono::milliseconds connect_try{1500};
  std::chrono::milliseconds connect_floor{1};
  /// The most a hello may wait for its answer over a new connection, and its floor. Over a
  /// connection the caller made earlier (search_start::connected) it waits connect_try: that
  /// connection may lead to a process that died since.
  std::chrono::milliseconds answer_try{std::chrono::seconds(3)};
  std::chrono::milliseconds answer_floor{1};
  /// The pause after failed tries: first_pause, then each one `backoff` times the one before,
  /// never more than max_pause (backoff 1: a constant pause; 0 ms: none).
  std::chrono::milliseconds first_pause{50};
  std::chrono::milliseconds max_pause{50};
  double backoff = 1.0;
  pacing pace = pacing::after_each_try;
  /// A leader's refusal ends the search (asking others will not help); otherwise the next one
  /// is asked, as a rehoming worker does (a leader may refuse while it takes over).
  bool stop_on_refusal = true;
  /// An endpoint of another job ends the search: a wrong address list, not a transient state.
  bool stop_on_other_job = false;
  /// With a single coordinator, a refused connection ends the search: nothing runs there any
  /// more (the job ended or its coordinator died), and a cut would be silent instead.
  bool lone_refusal_is_final = false;
  /// Past the deadline, each endpoint is still asked once before the search gives up (a search
  /// that started late must not give up on coordinators it never asked).
  bool ask_each_before_giving_up = false;
};

/// Today's values, one preset per caller (the integration plan maps each to its call site).
/// The worker's first connection to any coordinator (run_worker); it stops at the first reached.
search_policy worker_connect_policy();
/// The worker's first hello (rank_actor), over the connection run_worker made.
search_policy worker_start_policy();
/// A worker that lost its leader; `window` is the time it allows a coordinator to take it back.
search_policy worker_rehome_policy(bool several_coordinators, std::chrono::milliseconds window);
/// The agent's first hello, with several coordinators.
search_policy agent_start_policy();
/// An agent that lost its leader, with several coordinators; `silence_limit` 0 = not known.
search_policy agent_rehome_policy(std::chrono::milliseconds coordinator_timeout,
                                  std::chrono::milliseconds silence_limit);
/// An agent cut off from every coordinator, looking for the leader until --rejoin-timeout-ms.
search_policy agent_rejoin_policy(bool several_coordinators);

/// Where a search starts and what it already knows.
struct search_start {
  /// The leader followed last, or the endpoint the caller reached already; 0 when none.
  size_t last_leader = 0;
  /// That leader was lost: a standby more likely leads now, so it is asked last in the round.
  bool leader_lost = false;
  /// The newest leadership epoch this process followed: older leaders are passed over.
  int64_t epoch_seen = 0;
  /// The search gives up once this passes (search_time::max(): never).
  search_time deadline = search_time::max();
  /// The caller holds a connection to the first endpoint asked (a standby worker made it
  /// when it started): the first hello goes over it.
  bool connected = false;
};

/// Connect to endpoint `index` within `connect_within` (skip that when `reuse_connection`),
/// say hello, wait up to `answer_within`, and report with on_answer(ticket, ...).
struct ask_endpoint {
  uint64_t ticket = 0;
  size_t index = 0;
  std::chrono::milliseconds connect_within{0};
  std::chrono::milliseconds answer_within{0};
  bool reuse_connection = false;
};
/// Nothing to do before `until` (a pause, or the answer of the try in flight); call next then,
/// or earlier when an answer comes.
struct wait_until {
  search_time until;
};
/// The search is over without a leader; `index` is the endpoint whose answer ended it (for
/// the deadline, the last one asked).
struct give_up {
  give_up_reason reason = give_up_reason::deadline;
  size_t index = 0;
};
/// The leader at `index`, of `epoch`, took this process on.
struct leader_found {
  size_t index = 0;
  int64_t epoch = 0;
};
using search_action = std::variant<ask_endpoint, wait_until, give_up, leader_found>;

/// A coordinator's answer to one try, as the caller reports it.
struct reply {
  verdict what = verdict::no_answer;
  /// The answering coordinator's leadership epoch (welcome::epoch, launch_plan::epoch).
  int64_t epoch = 0;
  /// not_leading: the endpoint the standby says leads now (index_of maps an address), and the
  /// epoch it says that leader holds (0: not said).
  std::optional<size_t> named_leader = std::nullopt;
  int64_t named_epoch = 0;
  /// The words of the answer or the error, for logs.
  std::string detail = {};
};

/// What the search knows of one endpoint.
struct endpoint_record {
  std::string name;  ///< "host:port"
  size_t tries = 0;
  std::optional<verdict> last;  ///< nullopt: not answered yet
  std::string detail;           ///< the words of its last answer
};

class leader_search_machine {
 public:
  /// `endpoints`: every coordinator of the job as "host:port", in the order the job lists them.
  leader_search_machine(std::vector<std::string> endpoints, search_policy policy,
                        search_start start);

  /// What to do now. An ask is handed out once; until it is answered, next says to wait for
  /// it, and once its time (connect_within + answer_within) is over the machine counts it as
  /// no_answer itself. give_up and leader_found are final: next repeats them.
  search_action next(search_time now);

  /// The answer to the ask with `ticket`. Returns the verdict the machine took (a leader's
  /// answer of an epoch below epoch_floor() is taken as stale), or nullopt when that ask is no
  /// longer awaited (timed out, or the search is over): the caller then drops the connection.
  std::optional<verdict> on_answer(uint64_t ticket, reply r, search_time now);

  bool finished() const { return outcome_.has_value(); }
  /// The ask awaiting its answer, if any (an agent that sees the connection close reports it).
  std::optional<ask_endpoint> asking() const;
  /// The oldest epoch a leader may hold to be followed: the epoch seen at the start, raised
  /// by every leader that answered since and every leader a standby named.
  int64_t epoch_floor() const { return floor_; }
  size_t size() const { return records_.size(); }
  size_t tries() const { return tries_; }
  const endpoint_record& record(size_t index) const { return records_.at(index); }
  /// The index of endpoint "host:port", if it is one of the job's.
  std::optional<size_t> index_of(std::string_view name) const;
  /// The endpoints asked, in the order first asked.
  std::vector<std::string> asked() const;
  /// The words of the last answer that was not a welcome; empty when none.
  const std::string& last_answer() const { return last_answer_; }
  /// "host:port: what it said; host:port: not asked", for a log line.
  std::string summary() const;

 private:
  enum class ask_kind : uint8_t { round, detour, fresh_retry };
  struct in_flight {
    ask_endpoint ask;
    ask_kind kind = ask_kind::round;
    search_time until;
  };

  bool may_give_up() const;
  search_action finish(search_action outcome);
  search_action start_ask(size_t index, ask_kind kind, search_time now);
  verdict settle(const in_flight& a, reply r, search_time now);
  void count_failure(const in_flight& a, search_time now);

  std::vector<endpoint_record> records_;
  search_policy policy_;
  search_time deadline_;
  int64_t floor_ = 0;
  size_t cursor_ = 0;       // the next endpoint in round-robin order
  size_t round_fails_ = 0;  // round-robin tries failed since the last pause
  bool reuse_next_ = false;
  std::optional<size_t> detour_;       // a standby named the leader: asked next
  std::optional<size_t> fresh_retry_;  // a reused connection was silent: ask again, anew
  std::optional<in_flight> asking_;
  bool pause_owed_ = false;
  std::optional<search_time> resume_at_;
  std::chrono::milliseconds pause_{0};  // the next pause
  uint64_t next_ticket_ = 1;
  size_t tries_ = 0;
  size_t last_asked_ = 0;
  std::vector<size_t> asked_order_;
  std::string last_answer_;
  std::optional<search_action> outcome_;
};

/// The verdict of a failed connection, from the error's words: nothing listening, another
/// job's listener (its handshake says "belongs to job"), or anything else (no answer).
verdict verdict_of_connect_error(std::string_view error);

}  // namespace troupe::actors::wire
