#include "actors/node_supervisor.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <cerrno>
#include <csignal>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "actors/child_process.hpp"
#include "actors/connect.hpp"
#include "actors/messages.hpp"
#include "actors/tls_transport.hpp"
#include "actors/worker_control.hpp"
#include "monitoring/log.hpp"
#include "runtime/auth/credentials.hpp"
#include "runtime/sys/signal_route.hpp"

namespace troupe::actors {

leader_answer judge_leader_answer(const launch_plan& plan, int64_t epoch_seen) {
  if (plan.error.rfind(not_leading_prefix, 0) == 0) return leader_answer::not_leading;
  if (!plan.error.empty()) return leader_answer::refused;
  // A deposed leader that has not noticed yet still answers; following it would split the
  // job between two leaderships.
  if (plan.epoch < epoch_seen) return leader_answer::stale;
  return leader_answer::accepted;
}

namespace {

// The threads that reach coordinators for the agent: connecting blocks, so it runs beside the
// actor; run_agent joins them before the actor system goes away, since each one uses it.
class search_threads {
 public:
  void start(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    // A search makes one thread per try: the finished ones go now, not at the end.
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (*it->done) {
        it->thread.join();
        it = threads_.erase(it);
      } else {
        ++it;
      }
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    threads_.push_back({std::thread([fn = std::move(fn), done] {
                          fn();
                          *done = true;
                        }),
                        done});
  }
  void join_all() {
    std::vector<entry> threads;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.thread.join();
  }

 private:
  struct entry {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex mutex_;
  std::vector<entry> threads_;
};

std::string endpoint_text(const endpoint& e) { return e.host + ":" + std::to_string(e.port); }

// A coordinator reached (or not) by a search thread, for the agent to greet.
struct candidate_found {
  uint64_t search = 0;  // answers to a search that is over are dropped
  size_t index = 0;     // in agent_args::coordinators
  caf::actor handle;    // invalid: not reached (error says why)
  std::string error;
};
// The search's next try is due.
struct search_step {
  uint64_t search = 0;
};

}  // namespace
}  // namespace troupe::actors

// Both stay inside this process.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::candidate_found)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::search_step)

namespace troupe::actors {
namespace {

std::string local_host_name() {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  return host;
}

constexpr auto reap_interval = std::chrono::milliseconds(20);
constexpr auto stop_grace = std::chrono::seconds(10);  // workers finish their step, then SIGTERM
constexpr auto kill_grace = std::chrono::seconds(3);   // then SIGKILL

struct agent_state {
  agent_args args;
  caf::actor coordinator;
  std::map<int32_t, pid_t> workers;  // member -> pid, until reaped
  // A started, connected worker without a member id yet, which replaces the next one that
  // dies (its id goes down the pipe): a restart then skips the process's start-up.
  pid_t standby = -1;
  int standby_input = -1;
  bool standby_failed = false;  // one exited on its own: do not start another
  int32_t node = 0;
  int restarts_left = 0;
  std::chrono::milliseconds coordinator_timeout{0};  // 0 = not known yet
  // With several coordinators, a leader silent this long is looked past (as the workers do):
  // the search for the leader starts, for up to the coordinator timeout. 0 = not said.
  std::chrono::milliseconds heartbeat_timeout{0};
  std::chrono::steady_clock::time_point coordinator_seen = std::chrono::steady_clock::now();
  std::string exe, endpoint;
  bool stopping = false;
  int stop_stage = 0;  // 0 asked, 1 SIGTERM sent, 2 SIGKILL sent
  std::shared_ptr<std::atomic<int>> exit_code;
  // With several coordinators (takeover): the leadership followed, and the search for the
  // next one when it is lost. In between, coordinator is invalid, so that nothing the old one
  // still says counts, and what would go to it waits.
  int64_t epoch = 0;
  size_t coordinator_index = 0;  // in args.coordinators
  std::shared_ptr<search_threads> searches;
  bool rehoming = false;  // lost the leader, looking for the next
  std::string lost_why;
  std::chrono::steady_clock::time_point lost_at;
  // The search for the leader (at start, or rehoming): the coordinators are asked in turn.
  bool searching = false;
  uint64_t search_id = 0;
  agent_hello search_hello;
  size_t search_first = 0, search_tries = 0;
  std::chrono::steady_clock::time_point search_deadline;
  std::chrono::milliseconds search_hello_timeout{3000};
  std::vector<std::string> search_last;  // what each coordinator said last
  // The coordinator asked now, monitored: a hello sent over a connection that dies (a long cut)
  // is never answered, and its loss moves the search on instead of the hello's timeout.
  caf::actor asking;
  size_t asking_index = 0;
  uint64_t ask_id = 0;  // answers to an earlier hello, given up on, are dropped
  std::vector<worker_exited> unsent_exits;
  bool unsent_preempt = false;
  // Members whose process the leader removed (rejoin_exit_code) while this agent looked for a
  // leader: started again once one takes the node back on.
  std::vector<int32_t> removed_while_rehoming;
  // Cut off from every coordinator (for the coordinator timeout): the workers are stopped and
  // the agent looks for the leader until cut_at + rejoin_timeout, with backoff, to rejoin the
  // job and start its former members again. rejoin_timeout 0: it exits instead (fence_node).
  bool cut_off = false;
  std::string cut_why;
  std::chrono::steady_clock::time_point cut_at;
  std::chrono::milliseconds rejoin_timeout{0};
  std::chrono::milliseconds rejoin_backoff{0};
  // Every member a coordinator gave this node, whether its process still runs or not: a node
  // that rejoins after a cut asks for all of them back.
  std::set<int32_t> given_members;
  bool ticking = false;
  std::string host_name;
  bool several_coordinators() const { return args.coordinators.size() > 1; }
  // How long the coordinator this agent follows may stay silent before the agent acts: with
  // standby coordinators, the heartbeat timeout (then it looks for the leader); alone, the
  // coordinator timeout (then it fences). 0 = not known yet.
  std::chrono::milliseconds silence_limit() const {
    if (several_coordinators() && heartbeat_timeout.count() > 0 &&
        heartbeat_timeout < coordinator_timeout)
      return heartbeat_timeout;
    return coordinator_timeout;
  }
  static inline const char* name = "node_supervisor";
};
using self_ptr = caf::stateful_actor<agent_state>*;

const monitoring::log_context agent_ctx{"agent", -1, 0, -1};

void signal_all(self_ptr self, int sig) {
  for (auto& [rank, pid] : self->state.workers) kill(pid, sig);
}

// The command of a worker of this node: member `member`, or a standby when it is negative.
std::vector<std::string> worker_command(const agent_state& s, int32_t member) {
  std::vector<std::string> argv{s.exe, "worker", "--coordinator", s.endpoint};
  if (member >= 0) {
    argv.insert(argv.end(), {"--member", std::to_string(member)});
  } else {
    argv.push_back("--standby");
  }
  argv.insert(argv.end(), {"--node", std::to_string(s.node), "--join-token",
                           auth::process_credentials().token_path});
  if (!s.args.advertise.empty()) argv.insert(argv.end(), {"--advertise", s.args.advertise});
  return argv;
}

// Starts the standby if restarts are left and none is there; failures only mean that the
// next restart starts a process of its own.
void start_standby(self_ptr self) {
  auto& s = self->state;
  if (s.stopping || s.standby > 0 || s.standby_failed || s.restarts_left <= 0 || s.exe.empty())
    return;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  try {
    s.standby = spawn_child(worker_command(s, -1), false, 9, fds[0]);
    s.standby_input = fds[1];
  } catch (const std::exception& e) {
    monitoring::log(monitoring::level::warn, agent_ctx,
                    std::string("cannot start a standby worker: ") + e.what());
    ::close(fds[1]);
  }
  ::close(fds[0]);
}

void drop_standby(self_ptr self) {
  auto& s = self->state;
  if (s.standby_input >= 0) ::close(s.standby_input);
  s.standby_input = -1;
  if (s.standby > 0) {
    ::kill(s.standby, SIGKILL);  // it holds nothing
    (void)wait_for_exit(s.standby, std::chrono::seconds(2));
  }
  s.standby = -1;
}

// The process that takes over `member`: the standby, told its id, or a new one.
pid_t restart_worker(self_ptr self, int32_t member) {
  auto& s = self->state;
  if (s.standby > 0 && s.standby_input >= 0) {
    const std::string line = std::to_string(member) + "\n";
    size_t sent = 0;
    while (sent < line.size()) {
      const ssize_t n = ::write(s.standby_input, line.data() + sent, line.size() - sent);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    if (sent == line.size()) {
      ::close(s.standby_input);
      s.standby_input = -1;
      const pid_t pid = s.standby;
      s.standby = -1;
      start_standby(self);
      return pid;
    }
    drop_standby(self);  // it died: start one the usual way
  }
  const pid_t pid = spawn_child(worker_command(s, member));
  start_standby(self);
  return pid;
}

// A member whose process the leader removed (it was cut off or stopped past the heartbeat
// timeout, and said so with rejoin_exit_code): a new process joins the job in its place at the
// next generation. Not a restart of a failed process, so --max-restarts is not spent.
// Returns the new process, -1 if it could not be started.
pid_t start_again(self_ptr self, int32_t member) {
  try {
    const pid_t pid = restart_worker(self, member);
    monitoring::log(monitoring::level::warn, agent_ctx,
                    "member " + std::to_string(member) +
                        " was removed from the job while it was cut off; started it again to "
                        "rejoin");
    return pid;
  } catch (const std::exception& e) {
    monitoring::log(monitoring::level::error, agent_ctx,
                    "cannot start member " + std::to_string(member) + " again: " + e.what());
    return -1;
  }
}

// What the coordinator is told goes to the current one; while there is none (between leaders)
// it waits for the next.
void report_exit(self_ptr self, const worker_exited& what) {
  auto& s = self->state;
  if (s.rehoming || !s.coordinator)
    s.unsent_exits.push_back(what);
  else
    self->send(s.coordinator, what);
}

// Whether the message being handled comes from the coordinator this agent follows now (not
// from a deposed one that still talks, nor from anyone else).
bool from_coordinator(self_ptr self) {
  const auto& sender = self->current_sender();
  return sender && self->state.coordinator &&
         caf::actor_cast<caf::actor_addr>(sender) == self->state.coordinator.address();
}

void begin_stop(self_ptr self, int exit_code) {
  auto& st = self->state;
  st.searching = false;
  drop_standby(self);
  if (!st.stopping) st.exit_code->store(exit_code);
  st.stopping = true;
  if (st.workers.empty()) {
    self->quit();
    return;
  }
  self->delayed_send(self,
                     exit_code == 0
                         ? std::chrono::duration_cast<std::chrono::milliseconds>(stop_grace)
                         : std::chrono::milliseconds(0),
                     stop_atom::value, int32_t{1});
}

// The coordinator is lost (its connection closed, or no heartbeat from it for the coordinator
// timeout): this node fences itself. Its workers watch the coordinator too and stop on their
// own, each saying why, without depending on this agent, by the same timeout; the moment they
// get for it is short (a quarter of the timeout, at most a second), then SIGTERM, then
// SIGKILL half as long again later. Nothing is restarted and nothing is reported any more.
void fence_node(self_ptr self, const std::string& why) {
  auto& st = self->state;
  const auto timeout =
      st.coordinator_timeout.count() > 0 ? st.coordinator_timeout : std::chrono::milliseconds(2000);
  const auto term = std::min<std::chrono::milliseconds>(timeout / 4, std::chrono::seconds(1));
  const auto kill = term * 3 / 2;
  monitoring::log(monitoring::level::error, agent_ctx,
                  why + "; fenced: this node's workers stop on their own, any still running get " +
                      "SIGTERM in " + std::to_string(term.count()) + " ms, and none is restarted");
  st.searching = false;
  drop_standby(self);
  st.exit_code->store(1);
  st.stopping = true;
  if (st.workers.empty()) {
    self->quit();
    return;
  }
  self->delayed_send(self, term, stop_atom::value, int32_t{1});
  self->delayed_send(self, kill, stop_atom::value, int32_t{2});
}

void start_search(self_ptr self, agent_hello hello, size_t first,
                  std::chrono::steady_clock::time_point deadline,
                  std::chrono::milliseconds hello_timeout);

template <class Members>
std::string members_text(const Members& members) {
  std::string text;
  for (int32_t m : members) text += (text.empty() ? "" : ", ") + std::to_string(m);
  return "[" + text + "]";
}

// Cut off from every coordinator for the coordinator timeout (or the connection closed): the
// job has gone on without this node, so its workers stop now (they stopped computing already
// and fence themselves; any still running get SIGTERM, then SIGKILL) and nothing is restarted.
// But the agent stays: under a scheduler (srun --no-kill) or a Kubernetes Job nothing would
// start it again, and the node would be lost for the rest of the job. It looks for the leader
// until --rejoin-timeout-ms has passed (rejoin_search, from the tick once the workers are
// gone), and rejoins with its former members started again. Without a rejoin timeout it
// fences and exits, as before.
void enter_cut_off(self_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.rejoin_timeout.count() <= 0 || st.stopping) {
    fence_node(self, why);
    return;
  }
  const auto timeout =
      st.coordinator_timeout.count() > 0 ? st.coordinator_timeout : std::chrono::milliseconds(2000);
  const auto term = std::min<std::chrono::milliseconds>(timeout / 4, std::chrono::seconds(1));
  st.searching = false;
  ++st.search_id;  // answers to a search in flight are dropped
  st.rehoming = false;
  if (st.coordinator) self->demonitor(st.coordinator);
  st.coordinator = caf::actor{};
  drop_standby(self);
  if (!st.cut_off) {
    st.cut_off = true;
    st.cut_why = why;
    st.cut_at = std::chrono::steady_clock::now();
    st.rejoin_backoff = std::chrono::milliseconds(250);
  }
  st.removed_while_rehoming.clear();  // given_members has them: they come back with the node
  monitoring::log(monitoring::level::error, agent_ctx,
                  why + "; fenced: this node's workers stop (any still running get SIGTERM in " +
                      std::to_string(term.count()) +
                      " ms), and this agent looks for the leader for up to " +
                      std::to_string(st.rejoin_timeout.count()) +
                      " ms (--rejoin-timeout-ms) to rejoin the job with members " +
                      members_text(st.given_members) + " started again");
  st.stop_stage = 0;
  if (!st.workers.empty()) {
    self->delayed_send(self, term, stop_atom::value, int32_t{1});
    self->delayed_send(self, term * 3 / 2, stop_atom::value, int32_t{2});
  }
}

// The rejoin timeout passed (or the leader refused this node): the agent ends, saying so.
void give_up_rejoining(self_ptr self, const std::string& why) {
  auto& st = self->state;
  st.searching = false;
  const auto cut_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - st.cut_at);
  monitoring::log(monitoring::level::error, agent_ctx,
                  "cut off from the coordinator for " + std::to_string(cut_ms.count()) + " ms (" +
                      st.cut_why + "); " + why +
                      "; this agent exits (start it again, or resume the job, to bring this node "
                      "back)");
  begin_stop(self, 1);
}

// One search for the leader while cut off, asking each coordinator in turn with backoff
// between tries, until the rejoin deadline. The hello names the members this node ran: the
// leader hands back those that no process holds any more.
void rejoin_search(self_ptr self) {
  auto& s = self->state;
  agent_hello hello{protocol_version, s.host_name, getpid(), s.args.ranks};
  hello.rejoin = true;
  hello.node = s.node;
  hello.former_members.assign(s.given_members.begin(), s.given_members.end());
  hello.restarts_left = s.restarts_left;
  hello.epoch_seen = s.epoch;
  const auto deadline = s.cut_at + s.rejoin_timeout;
  // Alone, one hello waits as long as it must: a connection that survived the cut delivers it
  // once the link heals (a new one is made when it broke). With standbys, each gets a turn.
  const auto hello_timeout = s.several_coordinators()
                                 ? std::chrono::milliseconds(3000)
                                 : std::max(std::chrono::milliseconds(1000),
                                            std::chrono::duration_cast<std::chrono::milliseconds>(
                                                deadline - std::chrono::steady_clock::now()));
  start_search(self, std::move(hello), s.coordinator_index, deadline, hello_timeout);
}

// The coordinator's launch plan, accepted: this agent becomes node plan.node and starts its
// members.
void follow_plan(self_ptr self, const launch_plan& plan) {
  auto& s = self->state;
  s.node = plan.node;
  // The workers' data plane treats each agent as a host of its own (shm inside, TCP
  // across).
  ::setenv("TROUPE_NODE", std::to_string(plan.node).c_str(), 1);
  s.restarts_left = plan.max_restarts;
  s.coordinator_timeout = std::chrono::milliseconds(plan.coordinator_timeout_ms);
  s.heartbeat_timeout = std::chrono::milliseconds(plan.heartbeat_timeout_ms);
  s.rejoin_timeout = std::chrono::milliseconds(std::max(0, plan.rejoin_timeout_ms));
  set_control_socket_timeout(2 * s.coordinator_timeout);
  s.coordinator_seen = std::chrono::steady_clock::now();
  s.epoch = plan.epoch;
  s.exe = self_executable();
  // Workers look for the leader themselves when it changes, so they get every coordinator.
  s.endpoint = s.several_coordinators()
                   ? endpoints_text(s.args.coordinators)
                   : s.args.coordinator_host + ":" + std::to_string(s.args.coordinator_port);
  for (int32_t m : plan.members) {
    s.given_members.insert(m);
    try {
      s.workers[m] = spawn_child(worker_command(s, m));
    } catch (const std::exception& e) {
      monitoring::log(monitoring::level::error, agent_ctx,
                      "cannot start member " + std::to_string(m) + ": " + e.what());
      report_exit(self, worker_exited{m, 0, 127, 0});
    }
  }
  start_standby(self);
  if (!s.ticking) {
    s.ticking = true;
    self->send(self, tick_atom::value);
  }
}

void try_candidate(self_ptr self);

// The search ends with a leader that took this agent on: at start it follows the plan; when
// rehoming, it keeps its workers and tells the new leader what it missed.
void search_succeeded(self_ptr self, const caf::actor& leader, size_t index,
                      const launch_plan& plan) {
  auto& s = self->state;
  s.searching = false;
  s.coordinator = leader;
  s.coordinator_index = index;
  self->monitor(leader);
  if (s.cut_off) {
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - s.cut_at);
    s.cut_off = false;
    s.stop_stage = 0;
    monitoring::log(
        monitoring::level::warn, agent_ctx,
        "cut off from the coordinator for " + std::to_string(took.count()) + " ms (" + s.cut_why +
            "); rejoined the leader at " + endpoint_text(s.args.coordinators[index]) + " (epoch " +
            std::to_string(plan.epoch) + "), starting members " + members_text(plan.members) +
            " again (this node ran " + members_text(s.given_members) + ")");
    for (const auto& w : s.unsent_exits) self->send(s.coordinator, w);
    s.unsent_exits.clear();
    follow_plan(self, plan);
    if (s.unsent_preempt) self->send(s.coordinator, preempt_atom::value);
    s.unsent_preempt = false;
    return;
  }
  if (!s.rehoming) {
    follow_plan(self, plan);
    return;
  }
  s.rehoming = false;
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - s.lost_at);
  s.epoch = plan.epoch;
  s.coordinator_seen = std::chrono::steady_clock::now();
  if (plan.coordinator_timeout_ms > 0)
    s.coordinator_timeout = std::chrono::milliseconds(plan.coordinator_timeout_ms);
  if (plan.heartbeat_timeout_ms > 0)
    s.heartbeat_timeout = std::chrono::milliseconds(plan.heartbeat_timeout_ms);
  // The leader may allow fewer restarts than this node still has, never more.
  s.restarts_left = std::min<int>(s.restarts_left, std::max<int>(plan.max_restarts, 0));
  if (plan.node != s.node)
    monitoring::log(monitoring::level::warn, agent_ctx,
                    "the new leader calls this node " + std::to_string(plan.node) +
                        "; its workers keep node " + std::to_string(s.node));
  if (!plan.members.empty())
    monitoring::log(monitoring::level::warn, agent_ctx,
                    "the new leader asked a rejoining node to start " +
                        std::to_string(plan.members.size()) +
                        " members; it starts none (its workers are already running)");
  std::string members;
  for (const auto& [member, pid] : s.workers)
    members += (members.empty() ? "" : ", ") + std::to_string(member);
  monitoring::log(monitoring::level::warn, agent_ctx,
                  "lost the coordinator (" + s.lost_why + "); rejoined the leader at " +
                      endpoint_text(s.args.coordinators[index]) + " (epoch " +
                      std::to_string(s.epoch) + ") in " + std::to_string(took.count()) +
                      " ms with members [" + members + "]");
  for (const auto& w : s.unsent_exits) self->send(s.coordinator, w);
  s.unsent_exits.clear();
  if (s.unsent_preempt) self->send(s.coordinator, preempt_atom::value);
  s.unsent_preempt = false;
  for (int32_t member : std::exchange(s.removed_while_rehoming, {}))
    if (const pid_t pid = start_again(self, member); pid > 0) s.workers[member] = pid;
}

// The search ends without a leader: at start the agent gives up, when rehoming it fences.
void search_failed(self_ptr self, const std::string& why) {
  auto& s = self->state;
  s.searching = false;
  if (s.cut_off) {
    give_up_rejoining(self, why);
    return;
  }
  if (s.rehoming) {
    s.rehoming = false;
    enter_cut_off(self, "lost the coordinator (" + s.lost_why + "); " + why);
    return;
  }
  monitoring::log(monitoring::level::error, agent_ctx, why);
  begin_stop(self, 1);
}

// This try is over without a leader: the next one after a short pause (the coordinators may
// be electing one right now).
void next_candidate(self_ptr self, size_t index, std::string what) {
  auto& s = self->state;
  if (s.cut_off && !s.several_coordinators() &&
      what.find("Connection refused") != std::string::npos) {
    // The address answers, and nothing listens there: the only coordinator's process is gone
    // (the job ended, or it died), not behind a cut. Waiting would only hold this node.
    give_up_rejoining(self, "the coordinator's address " +
                                endpoint_text(s.args.coordinators[index]) +
                                " refuses connections: no coordinator runs there any more (if the "
                                "job did not finish, `troupe run --resume` continues it)");
    return;
  }
  s.search_last[index] = std::move(what);
  auto pacing = std::chrono::milliseconds(100);
  if (s.cut_off) {
    // The link may stay down for minutes: each try after a failed one waits longer, up to 5 s,
    // which is also the most a healed link waits for the next.
    pacing = s.rejoin_backoff;
    s.rejoin_backoff = std::min(s.rejoin_backoff * 2, std::chrono::milliseconds(5000));
  }
  self->delayed_send(self, pacing, search_step{s.search_id});
}

// Asks the agent's coordinators in turn, from `first`, round robin, until one leads and takes
// this agent on with `hello`, or `deadline` passes (each is asked at least once). The hello
// goes from this actor (the coordinator keeps its sender as the agent); only connecting,
// which blocks, runs on a thread.
void start_search(self_ptr self, agent_hello hello, size_t first,
                  std::chrono::steady_clock::time_point deadline,
                  std::chrono::milliseconds hello_timeout) {
  auto& s = self->state;
  s.searching = true;
  ++s.search_id;
  s.search_hello = std::move(hello);
  s.search_first = first;
  s.search_tries = 0;
  s.search_deadline = deadline;
  s.search_hello_timeout = hello_timeout;
  s.search_last.assign(s.args.coordinators.size(), "not asked");
  try_candidate(self);
}

void try_candidate(self_ptr self) {
  using namespace std::chrono;
  auto& s = self->state;
  if (!s.searching || s.stopping) return;
  const size_t n = s.args.coordinators.size();
  const auto now = steady_clock::now();
  if (s.search_tries >= n && now >= s.search_deadline) {
    std::string said;
    for (size_t i = 0; i < n; ++i)
      said += (i ? "; " : "") + endpoint_text(s.args.coordinators[i]) + ": " + s.search_last[i];
    const auto took = duration_cast<milliseconds>(now - (s.rehoming ? s.lost_at : now));
    if (s.cut_off) {
      search_failed(self, "no coordinator took it back on within " +
                              std::to_string(s.rejoin_timeout.count()) +
                              " ms (--rejoin-timeout-ms; " + said + ")");
      return;
    }
    search_failed(self, s.rehoming ? "no coordinator took this node on as leader within " +
                                         std::to_string(took.count()) + " ms (" + said + ")"
                                   : "no coordinator of " + endpoints_text(s.args.coordinators) +
                                         " took this agent on as leader in time (" + said +
                                         "); are they running, and is one of them elected?");
    return;
  }
  const size_t index = (s.search_first + s.search_tries++) % n;
  // A dead coordinator must not eat the time the live ones need, so each connect is short;
  // one still starting is simply asked again on the next round. Rehoming, the one that was
  // lost is likely dead and refuses at once: a round over the others must not wait on it.
  const auto left =
      std::max(duration_cast<milliseconds>(s.search_deadline - now), milliseconds(200));
  const auto connect_until =
      now + std::min(left, s.rehoming ? milliseconds(400) : milliseconds(1500));
  s.searches->start([&sys = self->system(), where = s.args.coordinators[index], connect_until,
                     agent = caf::actor_cast<caf::actor>(self), id = s.search_id, index] {
    auto h = remote_job_actor_until(sys, where.host, where.port, connect_until);
    candidate_found found{id, index, {}, {}};
    if (h && *h)
      found.handle = *h;
    else
      found.error = h ? std::string("nothing is published there") : sys.render(h.error());
    caf::anon_send(agent, std::move(found));
  });
}

void done_asking(self_ptr self, const caf::actor& whom) {
  auto& s = self->state;
  if (!s.asking || s.asking != whom) return;
  self->demonitor(s.asking);
  s.asking = caf::actor{};
}

void greet_candidate(self_ptr self, const candidate_found& found) {
  using namespace std::chrono;
  auto& s = self->state;
  if (!s.searching || s.stopping || found.search != s.search_id) return;
  if (!found.handle) {
    next_candidate(self, found.index, found.error);
    return;
  }
  const auto left = duration_cast<milliseconds>(s.search_deadline - steady_clock::now());
  const auto timeout = std::max(std::min(left, s.search_hello_timeout), milliseconds(1000));
  const auto id = s.search_id;
  s.asking = found.handle;
  s.asking_index = found.index;
  const auto ask = ++s.ask_id;
  self->monitor(found.handle);
  self->request(found.handle, timeout, s.search_hello)
      .then(
          [=](const launch_plan& plan) {
            auto& st = self->state;
            if (ask != st.ask_id) return;
            done_asking(self, found.handle);
            if (!st.searching || st.stopping || id != st.search_id) return;
            const auto where = endpoint_text(st.args.coordinators[found.index]);
            switch (judge_leader_answer(plan, st.epoch)) {
              case leader_answer::accepted:
                search_succeeded(self, found.handle, found.index, plan);
                return;
              case leader_answer::refused:
                search_failed(self, st.rehoming
                                        ? "the leader at " + where +
                                              " refused to take this node on: " + plan.error
                                        : "the coordinator refused this agent: " + plan.error);
                return;
              case leader_answer::not_leading:
                next_candidate(self, found.index, plan.error);
                return;
              case leader_answer::stale:
                next_candidate(self, found.index,
                               "leads epoch " + std::to_string(plan.epoch) +
                                   ", older than the epoch " + std::to_string(st.epoch) +
                                   " this agent followed");
                return;
            }
          },
          [=](caf::error& e) {
            auto& st = self->state;
            if (ask != st.ask_id) return;
            done_asking(self, found.handle);
            if (!st.searching || st.stopping || id != st.search_id) return;
            next_candidate(self, found.index, self->system().render(e));
          });
}

// The coordinator is lost (its connection closed, or it was silent for the heartbeat timeout)
// and the job has others: the workers keep running (and are reaped and restarted as usual)
// while the agent asks every coordinator, the lost one too (it may only have been slow), to
// take this node on again. None within the coordinator timeout, counted from here as the
// workers count it, fences the node.
void begin_rehome(self_ptr self, const std::string& why) {
  auto& s = self->state;
  s.rehoming = true;
  s.lost_why = why;
  s.lost_at = std::chrono::steady_clock::now();
  if (s.coordinator) self->demonitor(s.coordinator);
  s.coordinator = caf::actor{};
  agent_hello hello{protocol_version, s.host_name, getpid(), s.args.ranks};
  hello.rejoin = true;
  hello.node = s.node;
  for (const auto& [member, pid] : s.workers) {
    hello.members.push_back(member);
    hello.pids.push_back(pid);
  }
  hello.restarts_left = s.restarts_left;
  hello.epoch_seen = s.epoch;
  const auto timeout =
      s.coordinator_timeout.count() > 0 ? s.coordinator_timeout : std::chrono::milliseconds(10000);
  monitoring::log(monitoring::level::warn, agent_ctx,
                  "lost the coordinator (" + why + "); looking for the leader among " +
                      endpoints_text(s.args.coordinators) + " for up to " +
                      std::to_string(timeout.count()) + " ms; the workers keep running");
  // A cut-off or stopped coordinator is silent, not refusing (its connection may even be
  // open): a try at it must leave time for the others. A coordinator that runs answers in
  // milliseconds, so a try need not outlast half the silence this agent already allowed.
  auto hello_timeout = std::min<std::chrono::milliseconds>(std::chrono::seconds(3), timeout / 4);
  if (const auto limit = s.silence_limit(); limit.count() > 0)
    hello_timeout = std::min(hello_timeout, limit / 2);
  // The one that was lost is asked last: a standby has more likely taken over.
  start_search(self, std::move(hello), (s.coordinator_index + 1) % s.args.coordinators.size(),
               s.lost_at + timeout, hello_timeout);
}

caf::behavior node_supervisor(self_ptr self, agent_args args, caf::actor coordinator,
                              std::shared_ptr<std::atomic<int>> exit_code,
                              std::shared_ptr<search_threads> searches) {
  auto& st = self->state;
  st.args = std::move(args);
  st.coordinator = coordinator;
  st.exit_code = std::move(exit_code);
  st.searches = std::move(searches);
  st.host_name = local_host_name();
  if (st.args.coordinators.empty())  // alone: the rejoin search asks it
    st.args.coordinators.push_back(endpoint{st.args.coordinator_host, st.args.coordinator_port});
  if (coordinator) self->monitor(coordinator);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (s.asking && dm.source == s.asking.address()) {
      s.asking = caf::actor{};
      ++s.ask_id;
      if (s.searching && !s.stopping)
        next_candidate(self, s.asking_index,
                       "its connection closed: " + self->system().render(dm.reason));
      return;
    }
    if (!s.coordinator || dm.source != s.coordinator.address()) return;
    if (!s.stopping) {
      const std::string why = self->system().render(dm.reason);
      if (s.several_coordinators())
        begin_rehome(self, "its connection closed: " + why);
      else
        enter_cut_off(self, "lost the coordinator (" + why + ")");
      return;
    }
    begin_stop(self, s.exit_code->load());
  });

  if (st.several_coordinators()) {
    // Only the leader takes agents on; the standbys say so, and are passed over until one of
    // them leads.
    start_search(
        self, agent_hello{protocol_version, st.host_name, getpid(), st.args.ranks}, 0,
        std::chrono::steady_clock::now() + std::chrono::milliseconds(st.args.connect_timeout_ms),
        std::chrono::seconds(10));
  } else {
    self->request(coordinator, std::chrono::seconds(30),
                  agent_hello{protocol_version, st.host_name, getpid(), st.args.ranks})
        .then(
            [=](const launch_plan& plan) {
              if (!plan.error.empty()) {
                monitoring::log(monitoring::level::error, agent_ctx,
                                "the coordinator refused this agent: " + plan.error);
                begin_stop(self, 1);
                return;
              }
              follow_plan(self, plan);
            },
            [=](caf::error& e) {
              monitoring::log(monitoring::level::error, agent_ctx,
                              "the coordinator did not answer: " + self->system().render(e));
              begin_stop(self, 1);
            });
  }

  return {
      [=](tick_atom) {
        auto& s = self->state;
        if (s.standby > 0) {
          if (auto ended = try_reap(s.standby)) {
            monitoring::log(monitoring::level::warn, agent_ctx,
                            "the standby worker exited (code " + std::to_string(ended->exit_code) +
                                ", signal " + std::to_string(ended->signal) +
                                "); restarts start processes of their own");
            if (s.standby_input >= 0) ::close(s.standby_input);
            s.standby_input = -1;
            s.standby = -1;
            s.standby_failed = true;
          }
        }
        for (auto it = s.workers.begin(); it != s.workers.end();) {
          if (auto ended = try_reap(it->second)) {
            if (!s.stopping && !s.cut_off)
              report_exit(self,
                          worker_exited{it->first, it->second, ended->exit_code, ended->signal});
            const bool removed = ended->signal == 0 && ended->exit_code == rejoin_exit_code;
            if (removed && !s.stopping && !s.cut_off) {
              const int32_t member = it->first;
              if (s.rehoming) {  // the next leader takes the node on first
                s.removed_while_rehoming.push_back(member);
                it = s.workers.erase(it);
                continue;
              }
              if (const pid_t pid = start_again(self, member); pid > 0) {
                it->second = pid;
                ++it;
              } else {
                it = s.workers.erase(it);
              }
              continue;
            }
            const bool died = ended->signal != 0 || ended->exit_code != 0;
            if (!s.stopping && !s.cut_off && died && s.restarts_left > 0) {
              // The same member starts again and rejoins; the job admits it at a step boundary.
              --s.restarts_left;
              const int32_t member = it->first;
              monitoring::log(monitoring::level::warn, agent_ctx,
                              "member " + std::to_string(member) + " died; restarting it (" +
                                  std::to_string(s.restarts_left) + " restarts left)");
              try {
                it->second = restart_worker(self, member);
                ++it;
                continue;
              } catch (const std::exception& e) {
                monitoring::log(monitoring::level::error, agent_ctx,
                                std::string("restart failed: ") + e.what());
              }
            }
            it = s.workers.erase(it);
          } else {
            ++it;
          }
        }
        if (s.stopping && s.workers.empty()) {
          self->quit();
          return;
        }
        const auto now = std::chrono::steady_clock::now();
        const auto limit = s.silence_limit();
        if (s.cut_off && !s.stopping) {
          if (now >= s.cut_at + s.rejoin_timeout) {
            give_up_rejoining(self, "no coordinator took it back on within " +
                                        std::to_string(s.rejoin_timeout.count()) +
                                        " ms (--rejoin-timeout-ms)");
          } else if (s.workers.empty() && !s.searching) {
            rejoin_search(self);
          }
        }
        if (!s.stopping && !s.rehoming && !s.cut_off && limit.count() > 0 &&
            now - s.coordinator_seen > limit) {
          const bool early = limit < s.coordinator_timeout;
          const std::string silent =
              "no heartbeat from it for " + std::to_string(limit.count()) +
              (early ? " ms (--heartbeat-timeout-ms)" : " ms (--coordinator-timeout-ms)");
          if (s.several_coordinators())
            begin_rehome(self, silent);
          else
            enter_cut_off(self, "lost the coordinator: " + silent);
        }

        self->delayed_send(self, reap_interval, tick_atom::value);
      },
      [=](stop_atom) {
        if (from_coordinator(self)) begin_stop(self, 0);
      },
      [=](shutdown_atom, const std::string& why) {
        if (!self->state.stopping) monitoring::log(monitoring::level::error, agent_ctx, why);
        begin_stop(self, 1);
      },
      [=](const heartbeat& beat) {
        auto& s = self->state;
        // An older leadership's beat says nothing about the one this node follows.
        if (!from_coordinator(self) || beat.epoch < s.epoch) return;
        s.epoch = beat.epoch;
        s.coordinator_seen = std::chrono::steady_clock::now();
      },
      [=](const candidate_found& found) { greet_candidate(self, found); },
      [=](const search_step& step) {
        if (step.search == self->state.search_id) try_candidate(self);
      },
      // From the signal thread, when the job has several coordinators: for the one leading now.
      [=](preempt_atom) {
        auto& s = self->state;
        if (from_coordinator(self)) return;
        if (s.rehoming || !s.coordinator)
          s.unsent_preempt = true;
        else
          self->send(s.coordinator, preempt_atom::value);
      },
      [=](stop_atom, int32_t stage) {
        auto& s = self->state;
        // A cut-off node's stop that comes after it rejoined would hit its new workers.
        if (!s.stopping && !s.cut_off) return;
        if (s.workers.empty() || stage <= s.stop_stage) return;
        s.stop_stage = stage;
        signal_all(self, stage == 1 ? SIGTERM : SIGKILL);
        if (stage == 1) self->delayed_send(self, kill_grace, stop_atom::value, int32_t{2});
      },
  };
}

}  // namespace

int run_agent(const agent_args& args) {
  // Taken by one thread with sigwait (below); blocked before any thread starts.
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  troupe::sys::route_signals({SIGTERM, SIGUSR1});  // from a thread born before main (OpenBLAS)
  system_config cfg;
  cfg.use_network();
  caf::actor_system sys{cfg};
  auto searches = std::make_shared<search_threads>();
  caf::actor coordinator;  // several: the agent looks for the leader itself
  const bool several = args.coordinators.size() > 1;
  if (!several) {
    std::string error;
    coordinator = connect_to_coordinator(sys, args.coordinator_host, args.coordinator_port,
                                         std::chrono::milliseconds(args.connect_timeout_ms), error);
    if (!coordinator) {
      monitoring::log(monitoring::level::error, agent_ctx, error);
      return 1;
    }
  }
  auto code = std::make_shared<std::atomic<int>>(0);
  auto agent = sys.spawn(node_supervisor, args, coordinator, code, searches);
  // SIGTERM (also what the kernel sends when the launching coordinator dies) stops the
  // workers in order and says why, instead of ending the agent silently. Under a scheduler
  // (preempt_on_signals) SIGTERM and SIGUSR1 are the scheduler's word for the whole job: the
  // coordinator checkpoints the next step and stops it, and its stop (or its loss) stops us.
  std::atomic<bool> done{false};
  std::thread signals([agent, coordinator, parent = getppid(), &blocked, &done,
                       preempt = args.preempt_on_signals, several] {
    troupe::sys::wait_here_for_signals();
    for (;;) {
      siginfo_t info{};
      const int sig = sigwaitinfo(&blocked, &info);
      if (sig < 0 || done) return;
      if (preempt) {
        monitoring::log(monitoring::level::warn, agent_ctx,
                        std::string(sig == SIGTERM ? "SIGTERM" : "SIGUSR1") +
                            " from the scheduler: asked the coordinator to checkpoint the job "
                            "and stop it (exit 75)");
        // With several coordinators the one leading now is the agent's to know.
        caf::anon_send(several ? agent : coordinator, preempt_atom::value);
        continue;
      }
      if (sig == SIGUSR1) continue;
      // The kernel sends the death signal when the thread that started us exits, which can be
      // well before the rest of a large coordinator process is torn down and this process
      // handed to a new parent (seconds on a loaded machine). So a SIGTERM that may be that
      // signal (sent by the parent, or passed on by route_signals from one of our own
      // threads) waits for the reparenting to show; one from anyone else is acted on at once.
      const bool maybe_death_signal = info.si_pid == parent || info.si_pid == getpid();
      const auto wait = maybe_death_signal ? std::chrono::seconds(3) : std::chrono::seconds(0);
      for (const auto until = std::chrono::steady_clock::now() + wait;
           getppid() == parent && std::chrono::steady_clock::now() < until;)
        std::this_thread::sleep_for(std::chrono::milliseconds(4));
      caf::anon_send(agent, shutdown_atom::value,
                     getppid() != parent
                         ? std::string("lost the coordinator: the process that launched this agent "
                                       "died; stopping the workers")
                         : std::string("stopped by SIGTERM; stopping the workers"));
    }
  });
  sys.await_all_actors_done();
  searches->join_all();  // they use the actor system
  troupe::sys::stop_waiting_for_signals();
  done = true;
  pthread_kill(signals.native_handle(), SIGUSR1);
  signals.join();
  return code->load();
}

}  // namespace troupe::actors
