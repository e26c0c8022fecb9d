// The agent's search for the leader among its job's coordinators: at start (with standbys),
// rehoming when the one it followed is lost, and rejoining after a cut. Part of the agent
// (actors/agent/node_agent_state.hpp); nothing outside the agent uses it.

#include <algorithm>
#include <caf/all.hpp>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "actors/agent/node_agent_state.hpp"
#include "actors/wire/connect.hpp"
#include "actors/wire/messages.hpp"
#include "monitoring/log.hpp"

namespace troupe::actors::agent_detail {
namespace {

template <class Members>
std::string members_text(const Members& members) {
  std::string text;
  for (int32_t m : members) text += (text.empty() ? "" : ", ") + std::to_string(m);
  return "[" + text + "]";
}

}  // namespace

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

}  // namespace troupe::actors::agent_detail
