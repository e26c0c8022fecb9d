#pragma once
// Inside the agent process (actors/agent/node_supervisor.cpp and
// actors/agent/node_leader_search.cpp): the node supervisor actor's state and the steps of its life
// that the two files share. Not an interface for anything outside the agent.

#include <unistd.h>

#include <atomic>
#include <caf/all.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "actors/agent/node_supervisor.hpp"
#include "actors/wire/connect.hpp"
#include "actors/wire/leader_search.hpp"
#include "actors/wire/messages.hpp"
#include "monitoring/log.hpp"

namespace troupe::actors::agent_detail {

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

inline std::string endpoint_text(const endpoint& e) {
  return e.host + ":" + std::to_string(e.port);
}

// A coordinator reached (or not) by a search thread, for the agent to greet.
struct candidate_found {
  uint64_t search = 0;  // answers to a search that is over are dropped
  uint64_t ticket = 0;  // the search machine's ask this answers
  size_t index = 0;     // in agent_args::coordinators
  caf::actor handle;    // invalid: not reached (error says why)
  std::string error;
};
// The search machine asked to be woken: a pause is over, or a try's time is up.
struct search_step {
  uint64_t search = 0;
  uint64_t wake = 0;  // only the latest wake counts: timers never pile up
};

}  // namespace troupe::actors::agent_detail

// Both stay inside this process.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::agent_detail::candidate_found)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::agent_detail::search_step)

namespace troupe::actors::agent_detail {

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
  // The search for the leader (at start, rehoming, or rejoining after a cut): the machine
  // (actors/wire/leader_search.hpp) decides whom to ask, when, and when to give up; this
  // actor connects, says hello and reports what it heard.
  bool searching = false;
  uint64_t search_id = 0;
  agent_hello search_hello;
  std::unique_ptr<wire::leader_search_machine> search;
  uint64_t search_wake = 0;
  // The coordinator asked now, monitored: a hello sent over a connection that dies (a long cut)
  // is never answered, and its loss moves the search on instead of the hello's timeout.
  caf::actor asking;
  uint64_t asking_ticket = 0;  // answers to an earlier hello, given up on, are dropped
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

// The agent's workers (actors/agent/node_supervisor.cpp).
void drop_standby(self_ptr self);
/// A member whose process the leader removed (rejoin_exit_code) starts again; -1 if it could not.
pid_t start_again(self_ptr self, int32_t member);
void begin_stop(self_ptr self, int exit_code);
void fence_node(self_ptr self, const std::string& why);
/// The coordinator's launch plan, accepted: this agent becomes node plan.node and starts its
/// members.
void follow_plan(self_ptr self, const launch_plan& plan);

// Finding the leader (actors/agent/node_leader_search.cpp).
/// Asks the agent's coordinators as the search machine says, until one leads and takes this
/// agent on with `hello`, or the machine gives up.
void start_search(self_ptr self, agent_hello hello, const wire::search_policy& policy,
                  const wire::search_start& start);
/// Does what the search machine says now: connect to a coordinator, wait, or give up.
void drive_search(self_ptr self);
void greet_candidate(self_ptr self, const candidate_found& found);
/// The coordinator asked now closed its connection.
void asked_one_lost(self_ptr self, const std::string& why);
/// Several coordinators and the one followed is lost: looks for the leader, workers running.
void begin_rehome(self_ptr self, const std::string& why);
/// Cut off from every coordinator: the workers stop, the agent stays and looks for the leader.
void enter_cut_off(self_ptr self, const std::string& why);
void give_up_rejoining(self_ptr self, const std::string& why);
/// One search for the leader while cut off, once the workers are gone.
void rejoin_search(self_ptr self);

}  // namespace troupe::actors::agent_detail
