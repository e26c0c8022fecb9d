// Finding the leader among a job's coordinators at start-up (with standbys), and rehoming when
// the one a worker followed is lost: to the next leader, or back to the only coordinator after
// a silence (a healed cut).
// Part of the worker (actors/worker/rank_worker.hpp); nothing outside the worker uses it.

#include <unistd.h>

#include <algorithm>
#include <caf/all.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/wire/connect.hpp"
#include "actors/worker/rank_worker.hpp"
#include "monitoring/log.hpp"
#include "runtime/comm/host_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/config.hpp"
#include "strategies/planner.hpp"

namespace troupe::actors::worker_detail {

// This machine's name, as a hello tells it.
std::string this_host() {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  return host;
}

std::string endpoint_name(const endpoint& e) { return e.host + ":" + std::to_string(e.port); }

// The store listens where the coordinator does; a coordinator that listens on every address
// (--host 0.0.0.0) is reached at the address this worker was given for it.
std::string store_host_of(const welcome& answer, const endpoint& coordinator) {
  const auto& h = answer.store_host;
  return h == "0.0.0.0" || h == "::" || h.empty() ? coordinator.host : h;
}

namespace {

wire::verdict verdict_of(welcome_verdict v) {
  switch (v) {
    case welcome_verdict::leader:
      return wire::verdict::welcomed;
    case welcome_verdict::not_leading:
      return wire::verdict::not_leading;
    case welcome_verdict::stale:
      return wire::verdict::stale;
    case welcome_verdict::told_to_go:
      return wire::verdict::told_to_go;
    case welcome_verdict::refused:
      break;
  }
  return wire::verdict::refused;
}

// What an answer says, in the words of the worker's log.
std::string words_of(wire::verdict v, const welcome& got, const std::string& where, int64_t floor) {
  switch (v) {
    case wire::verdict::stale:
      return where + " leads epoch " + std::to_string(got.epoch) + ", older than epoch " +
             std::to_string(floor);
    case wire::verdict::refused:
      return "the coordinator at " + where + " refused this member: " + got.error;
    case wire::verdict::told_to_go:
      return got.error;
    default:
      return where + ": " + got.error;
  }
}

}  // namespace

found_leader search_leader(caf::blocking_actor* self, const std::vector<endpoint>& endpoints,
                           const hello& h, const wire::search_policy& policy,
                           const wire::search_start& start, caf::actor connected,
                           const admit_leader& admit) {
  using std::chrono::milliseconds;
  wire::leader_search_machine m(endpoint_names(endpoints), policy, start);
  found_leader out;
  for (;;) {
    const auto action = m.next(clock_type::now());
    if (const auto* wait = std::get_if<wire::wait_until>(&action)) {
      std::this_thread::sleep_until(wait->until);
      continue;
    }
    if (const auto* g = std::get_if<wire::give_up>(&action)) {
      out.ended = *g;
      if (g->index < m.size()) out.said = m.record(g->index).detail;
      break;
    }
    if (!std::holds_alternative<wire::ask_endpoint>(action)) break;  // leader_found: taken below
    const auto ask = std::get<wire::ask_endpoint>(action);
    const endpoint& e = endpoints[ask.index];
    const std::string where = endpoint_name(e);
    caf::actor c = ask.reuse_connection ? std::exchange(connected, caf::actor{}) : caf::actor{};
    std::string error;
    if (!c)
      c = connect_to_coordinator(self->system(), e.host, e.port,
                                 std::max(ask.connect_within, milliseconds(1)), error);
    if (!c) {
      m.on_answer(ask.ticket, {wire::verdict_of_connect_error(error), 0, std::nullopt, 0, error},
                  clock_type::now());
      continue;
    }
    std::optional<welcome> got;
    self->request(c, std::max(ask.answer_within, milliseconds(1)), h)
        .receive([&](welcome& x) { got = std::move(x); },
                 [&](caf::error& err) {
                   error = "the coordinator at " + where +
                           " did not answer hello: " + self->system().render(err);
                 });
    if (!got) {
      m.on_answer(ask.ticket, {wire::verdict::no_answer, 0, std::nullopt, 0, error},
                  clock_type::now());
      continue;
    }
    auto v = verdict_of(judge_welcome(*got, m.epoch_floor()));
    std::string words = words_of(v, *got, where, m.epoch_floor());
    if (v == wire::verdict::welcomed && admit) {
      if (std::string refused = admit(*got, ask.index); !refused.empty()) {
        v = wire::verdict::no_answer;
        words = std::move(refused);
      }
    }
    if (m.on_answer(ask.ticket, {v, got->epoch, std::nullopt, 0, words}, clock_type::now()) ==
        wire::verdict::welcomed) {
      out.actor = c;
      out.answer = std::move(*got);
      out.index = ask.index;
      break;
    }
  }
  out.asked = m.asked();
  out.last = m.last_answer();
  return out;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

// The coordinator was lost: keep what this member holds (its engine's committed state; a voted
// step is never applied) and ask each coordinator in turn (the only one, without standbys) to
// take it back on, until the coordinator timeout. The leader that does answers with an abort
// and a reconfigure, which serve() then waits for as usual. One that declared this member lost
// meanwhile says so (welcome_verdict::told_to_go): the process exits and its agent starts the
// member again. Nobody answering in time fences the process.
std::optional<int> rehome(worker& w, const std::string& why) {
  const auto start = clock_type::now();
  w.shared->rehoming().store(true);
  w.shared->abort_running(why);
  const auto limit = liveness_of(w.cfg.elastic).coordinator;
  // With standbys a takeover may take the whole timeout from here. Alone, the coordinator is
  // given the coordinator timeout from its last word, as before it ever fell silent, but at
  // least half a second to answer (a process that woke from a SIGSTOP asks once).
  auto timeout = limit;
  if (!w.ha()) {
    const auto silent =
        std::chrono::milliseconds(static_cast<int64_t>(w.shared->coordinator_silence() * 1000));
    timeout = std::max(limit - silent, std::chrono::milliseconds(500));
  }
  const auto deadline = start + timeout;
  hello h{protocol_version,          w.member, getpid(), this_host(), w.node, w.control,
          comm::transport_identity()};
  h.rejoin = true;
  h.relay = w.relay;  // the new leader commits and beats through it, as the old one did
  h.epoch_seen = w.epoch_seen;
  h.newest_generation = w.newest_generation;
  const state_report held = report_for(w, 0);
  h.held_generation = held.held_generation;
  h.held_rank = held.held_rank;
  h.held_step = held.held_step;
  // The new leader knows no plan of the old one's generations: the layout the state is in.
  if (held.held_generation > 0 && held.held_generation == w.current.generation)
    h.held_plan_json = strategies::to_json(w.current.plan);
  // The new leader serves a store of its own: the data plane meets there from now on. A
  // leader whose store cannot be reached is passed over like a silent one.
  std::unique_ptr<comm::kv_store> store;
  const admit_leader reach_store = [&](const welcome& answer, size_t index) -> std::string {
    const endpoint& e = w.coordinators[index];
    const auto store_wait = std::max(
        std::chrono::milliseconds(1000),
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()));
    try {
      store = comm::connect_tcp_store(
          store_host_of(answer, e), static_cast<uint16_t>(answer.store_port),
          std::min(store_wait, std::chrono::milliseconds(w.cfg.step_timeout_ms)));
      return "";
    } catch (const std::exception& ex) {
      std::string why_not =
          "the store of the coordinator at " + endpoint_name(e) + ": " + ex.what();
      monitoring::log(monitoring::level::warn, w.log_ctx(), why_not);
      return why_not;
    }
  };
  // The lost leader is asked last in the round: it is the least likely to lead now.
  wire::search_start at;
  at.last_leader = w.leader_index;
  at.leader_lost = true;
  at.epoch_seen = w.epoch_seen;
  at.deadline = deadline;
  auto found = search_leader(w.self, w.coordinators, h, wire::worker_rehome_policy(w.ha(), timeout),
                             at, {}, reach_store);
  if (found.ended && found.ended->reason == wire::give_up_reason::told_to_go) {
    w.shared->fence();
    w.shared->abort_older_than(0, true, found.said);
    const int code = exit_code_after_stop(found.said);
    monitoring::log(monitoring::level::warn, w.log_ctx(),
                    why + "; the leader at " + endpoint_name(w.coordinators[found.ended->index]) +
                        " said: " + found.said + " (exit " + std::to_string(code) + ")");
    return code;
  }
  if (found.actor) {
    const endpoint& e = w.coordinators[found.index];
    if (w.coordinator) w.self->demonitor(w.coordinator);
    w.coordinator = found.actor;
    w.self->monitor(w.coordinator);
    w.leader = e;
    w.leader_index = found.index;
    w.epoch_seen = found.answer.epoch;
    w.shared->epoch_seen().store(w.epoch_seen);
    w.shared->set_coordinator(w.coordinator);
    w.store = std::move(store);
    // Beats keep going through the node's relay, which follows the new leader itself.
    if (w.beats) w.beats->retarget(w.relay ? w.relay : w.coordinator);
    w.shared->coordinator_seen();
    w.shared->rehoming().store(false);
    const auto took =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start);
    monitoring::log(monitoring::level::warn, w.log_ctx(),
                    why + "; rejoined the leader at " + endpoint_name(e) + " (epoch " +
                        std::to_string(w.epoch_seen) + ") in " + std::to_string(took.count()) +
                        " ms, holding step " + std::to_string(held.held_step));
    return std::nullopt;
  }
  const std::string asked = joined(found.asked);
  const std::string& last = found.last;
  w.shared->fence();
  w.shared->abort_older_than(0, true, "the coordinator is gone");
  monitoring::log(monitoring::level::error, w.log_ctx(),
                  why + "; no coordinator took this member back on within " +
                      std::to_string(timeout.count()) + " ms (asked " + asked +
                      "; last answer: " + (last.empty() ? "none" : last) +
                      "); fenced: this worker sends no vote, writes no checkpoint and exits (if "
                      "no coordinator leads the job any more, resume it with --resume)");
  return 1;
}

int exit_code_after_stop(const std::string& why) {
  if (why.starts_with(removed_prefix)) return rejoin_exit_code;
  if (why.starts_with(evicted_prefix)) return 0;  // told to go: not a failure to restart
  return why.empty() ? 0 : 1;
}

}  // namespace troupe::actors::worker_detail
