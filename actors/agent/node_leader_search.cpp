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
  wire::search_start at;
  at.last_leader = s.coordinator_index;
  at.epoch_seen = s.epoch;
  at.deadline = s.cut_at + s.rejoin_timeout;
  start_search(self, std::move(hello), wire::agent_rejoin_policy(s.several_coordinators()), at);
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
  // The node's relay carries its workers' votes and beats to the new leader from now on (if
  // the leader's beat has not reached the relay first).
  if (plan.relay && s.args.relay)
    self->send(s.args.relay, lead_atom::value, s.coordinator,
               static_cast<int32_t>(heartbeat_interval(s.heartbeat_timeout).count()), plan.epoch);
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

namespace {

wire::verdict verdict_of(leader_answer a) {
  switch (a) {
    case leader_answer::accepted:
      return wire::verdict::welcomed;
    case leader_answer::not_leading:
      return wire::verdict::not_leading;
    case leader_answer::stale:
      return wire::verdict::stale;
    case leader_answer::refused:
      break;
  }
  return wire::verdict::refused;
}

// Why the search ended without a leader, in the words of the agent's log.
std::string give_up_text(const agent_state& s, const wire::give_up& g) {
  const auto& m = *s.search;
  const std::string where = m.size() > g.index ? m.record(g.index).name : "?";
  const std::string said = m.size() > g.index ? m.record(g.index).detail : "";
  switch (g.reason) {
    case wire::give_up_reason::refused:
    case wire::give_up_reason::told_to_go:
      return s.rehoming ? "the leader at " + where + " refused to take this node on: " + said
                        : "the coordinator refused this agent: " + said;
    case wire::give_up_reason::nobody_listens:
      // The address answers, and nothing listens there: the only coordinator's process is
      // gone (the job ended, or it died), not behind a cut. Waiting would only hold this node.
      return "the coordinator's address " + where +
             " refuses connections: no coordinator runs there any more (if the job did not "
             "finish, `troupe run --resume` continues it)";
    case wire::give_up_reason::other_job:
    case wire::give_up_reason::no_endpoints:
      return std::string(wire::to_string(g.reason)) + " (" + m.summary() + ")";
    case wire::give_up_reason::deadline:
      break;
  }
  if (s.cut_off)
    return "no coordinator took it back on within " + std::to_string(s.rejoin_timeout.count()) +
           " ms (--rejoin-timeout-ms; " + m.summary() + ")";
  if (s.rehoming) {
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - s.lost_at);
    return "no coordinator took this node on as leader within " + std::to_string(took.count()) +
           " ms (" + m.summary() + ")";
  }
  return "no coordinator of " + endpoints_text(s.args.coordinators) +
         " took this agent on as leader in time (" + m.summary() +
         "); are they running, and is one of them elected?";
}

// Wakes the search at `when`. CAF's timers are kept short (5 s at most: the machine is asked
// again then, and says to wait on), and a later wake replaces an earlier one.
void wake_search(self_ptr self, std::chrono::steady_clock::time_point when) {
  using namespace std::chrono;
  auto& s = self->state;
  const auto now = steady_clock::now();
  milliseconds delay(0);
  if (when > now)
    delay = when - now >= seconds(5) ? milliseconds(5000)
                                     : duration_cast<milliseconds>(when - now) + milliseconds(1);
  self->delayed_send(self, delay, search_step{s.search_id, ++s.search_wake});
}

void connect_to_candidate(self_ptr self, const wire::ask_endpoint& ask,
                          std::chrono::steady_clock::time_point now) {
  auto& s = self->state;
  const auto connect_until = now + ask.connect_within;
  s.searches->start([&sys = self->system(), where = s.args.coordinators[ask.index], connect_until,
                     agent = caf::actor_cast<caf::actor>(self), id = s.search_id,
                     ticket = ask.ticket, index = ask.index] {
    auto h = remote_job_actor_until(sys, where.host, where.port, connect_until);
    candidate_found found{id, ticket, index, {}, {}};
    if (h && *h)
      found.handle = *h;
    else
      found.error = h ? std::string("nothing is published there") : sys.render(h.error());
    caf::anon_send(agent, std::move(found));
  });
}

}  // namespace

// The machine keeps the rules (whom to ask next, the pacing, the deadline); connecting, which
// blocks, runs on a thread, and the hello goes from this actor (the coordinator keeps its
// sender as the agent).
void start_search(self_ptr self, agent_hello hello, const wire::search_policy& policy,
                  const wire::search_start& start) {
  auto& s = self->state;
  s.searching = true;
  ++s.search_id;
  s.search_hello = std::move(hello);
  s.search = std::make_unique<wire::leader_search_machine>(endpoint_names(s.args.coordinators),
                                                           policy, start);
  drive_search(self);
}

void drive_search(self_ptr self) {
  auto& s = self->state;
  if (!s.searching || s.stopping || !s.search) return;
  const auto now = std::chrono::steady_clock::now();
  const auto action = s.search->next(now);
  if (const auto* ask = std::get_if<wire::ask_endpoint>(&action)) {
    connect_to_candidate(self, *ask, now);
    // The machine counts a try that outlives its time as unanswered, so it is asked then.
    wake_search(self, now + ask->connect_within + ask->answer_within);
  } else if (const auto* wait = std::get_if<wire::wait_until>(&action)) {
    wake_search(self, wait->until);
  } else if (const auto* g = std::get_if<wire::give_up>(&action)) {
    search_failed(self, give_up_text(s, *g));
  }
  // leader_found: the answer that found it has already followed the leader.
}

void done_asking(self_ptr self, const caf::actor& whom) {
  auto& s = self->state;
  if (!s.asking || s.asking != whom) return;
  self->demonitor(s.asking);
  s.asking = caf::actor{};
}

void asked_one_lost(self_ptr self, const std::string& why) {
  auto& s = self->state;
  s.asking = caf::actor{};
  if (!s.searching || s.stopping || !s.search) return;
  if (s.search->on_answer(s.asking_ticket, {wire::verdict::no_answer, 0, std::nullopt, 0, why},
                          std::chrono::steady_clock::now()))
    drive_search(self);
}

void greet_candidate(self_ptr self, const candidate_found& found) {
  auto& s = self->state;
  if (!s.searching || s.stopping || found.search != s.search_id || !s.search) return;
  if (!found.handle) {
    const wire::reply r{wire::verdict_of_connect_error(found.error), 0, std::nullopt, 0,
                        found.error};
    if (s.search->on_answer(found.ticket, r, std::chrono::steady_clock::now())) drive_search(self);
    return;
  }
  const auto ask = s.search->asking();
  if (!ask || ask->ticket != found.ticket) return;  // its time ran out meanwhile
  const auto id = s.search_id;
  s.asking = found.handle;
  s.asking_ticket = found.ticket;
  self->monitor(found.handle);
  const auto current = [=] {
    auto& st = self->state;
    return st.searching && !st.stopping && id == st.search_id && st.search &&
           st.asking_ticket == found.ticket;
  };
  self->request(found.handle, ask->answer_within, s.search_hello)
      .then(
          [=](const launch_plan& plan) {
            if (!current()) return;
            auto& st = self->state;
            done_asking(self, found.handle);
            const auto answer = judge_leader_answer(plan, st.search->epoch_floor());
            std::string detail = plan.error;
            if (answer == leader_answer::stale)
              detail = "leads epoch " + std::to_string(plan.epoch) + ", older than the epoch " +
                       std::to_string(st.search->epoch_floor()) + " this agent followed";
            const auto taken = st.search->on_answer(
                found.ticket, {verdict_of(answer), plan.epoch, std::nullopt, 0, detail},
                std::chrono::steady_clock::now());
            if (taken == wire::verdict::welcomed)
              search_succeeded(self, found.handle, found.index, plan);
            else if (taken)
              drive_search(self);
          },
          [=](caf::error& e) {
            if (!current()) return;
            auto& st = self->state;
            done_asking(self, found.handle);
            if (st.search->on_answer(
                    found.ticket,
                    {wire::verdict::no_answer, 0, std::nullopt, 0, self->system().render(e)},
                    std::chrono::steady_clock::now()))
              drive_search(self);
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
  // The one that was lost is asked last: a standby has more likely taken over.
  wire::search_start at;
  at.last_leader = s.coordinator_index;
  at.leader_lost = true;
  at.epoch_seen = s.epoch;
  at.deadline = s.lost_at + timeout;
  start_search(self, std::move(hello), wire::agent_rehome_policy(timeout, s.silence_limit()), at);
}

}  // namespace troupe::actors::agent_detail
