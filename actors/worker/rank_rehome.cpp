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

leader_search find_leader(caf::blocking_actor* self, const std::vector<endpoint>& endpoints,
                          size_t first, caf::actor connected, const hello& h, int64_t epoch_seen,
                          clock_type::time_point deadline, std::chrono::milliseconds connect_try,
                          std::chrono::milliseconds request_try, bool stop_on_refusal) {
  using std::chrono::milliseconds;
  constexpr milliseconds pacing(50);  // a round of refusals does not spin on the network
  leader_search out;
  for (size_t i = first;;) {
    const endpoint& e = endpoints[i];
    const std::string where = endpoint_name(e);
    if (std::find(out.asked.begin(), out.asked.end(), where) == out.asked.end())
      out.asked.push_back(where);
    const auto left = std::max(
        milliseconds(1), std::chrono::duration_cast<milliseconds>(deadline - clock_type::now()));
    caf::actor c = std::exchange(connected, caf::actor{});
    // A connection made before (a standby worker's, made when it started) may lead to a
    // coordinator that has died since, and another may serve its address now: a hello that
    // gets no answer on it within a connection try is asked again there over a new one.
    const bool made_before = static_cast<bool>(c);
    bool again = false;
    std::string error;
    if (!c)
      c = connect_to_coordinator(self->system(), e.host, e.port, std::min(connect_try, left),
                                 error);
    if (!c) {
      out.last = error;
    } else {
      std::optional<welcome> got;
      self->request(c, std::min(made_before ? connect_try : request_try, left), h)
          .receive([&](welcome& x) { got = std::move(x); },
                   [&](caf::error& err) {
                     out.last = "the coordinator at " + where +
                                " did not answer hello: " + self->system().render(err);
                   });
      if (got) {
        switch (judge_welcome(*got, epoch_seen)) {
          case welcome_verdict::leader:
            out.actor = c;
            out.answer = std::move(*got);
            out.index = i;
            return out;
          case welcome_verdict::not_leading:
            out.last = where + ": " + got->error;
            break;
          case welcome_verdict::stale:
            out.last = where + " leads epoch " + std::to_string(got->epoch) +
                       ", older than epoch " + std::to_string(epoch_seen);
            break;
          case welcome_verdict::told_to_go:
            out.last = where + ": " + got->error;
            out.told_to_go = got->error;
            return out;
          case welcome_verdict::refused:
            out.last = "the coordinator at " + where + " refused this member: " + got->error;
            if (stop_on_refusal) {
              out.refused = true;
              return out;
            }
            break;
        }
      } else {
        again = made_before;
      }
    }
    if (clock_type::now() + pacing >= deadline) return out;
    if (again) continue;
    i = endpoint_after(i, endpoints.size());
    std::this_thread::sleep_for(pacing);
  }
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
  h.epoch_seen = w.epoch_seen;
  h.newest_generation = w.newest_generation;
  const state_report held = report_for(w, 0);
  h.held_generation = held.held_generation;
  h.held_rank = held.held_rank;
  h.held_step = held.held_step;
  // The new leader knows no plan of the old one's generations: the layout the state is in.
  if (held.held_generation > 0 && held.held_generation == w.current.generation)
    h.held_plan_json = strategies::to_json(w.current.plan);
  // The lost leader is asked last in the round: it is the least likely to lead now.
  size_t first = endpoint_after(w.leader_index, w.coordinators.size());
  std::vector<std::string> asked;
  std::string last;
  for (;;) {
    // A dead coordinator refuses the connection at once and a standby answers within
    // milliseconds; short tries let a round over every coordinator take well under a second.
    auto found = find_leader(
        w.self, w.coordinators, first, {}, h, w.epoch_seen, deadline,
        std::chrono::milliseconds(250),
        // A cut-off coordinator is silent, not refusing: a try at it must leave time in the
        // window for the others. Alone, one hello waits for the whole window: each repeat
        // would reach it after a healed cut, and each would form the generation again.
        w.ha() ? std::min<std::chrono::milliseconds>(std::chrono::seconds(3), timeout / 4)
               : timeout,
        false);
    for (auto& a : found.asked)
      if (std::find(asked.begin(), asked.end(), a) == asked.end()) asked.push_back(a);
    if (!found.last.empty()) last = found.last;
    if (!found.told_to_go.empty()) {
      w.shared->fence();
      w.shared->abort_older_than(0, true, found.told_to_go);
      const int code = exit_code_after_stop(found.told_to_go);
      monitoring::log(monitoring::level::warn, w.log_ctx(),
                      why + "; the leader at " + last.substr(0, last.find(": ")) +
                          " said: " + found.told_to_go + " (exit " + std::to_string(code) + ")");
      return code;
    }
    if (!found.actor) break;
    const endpoint& e = w.coordinators[found.index];
    // The new leader serves a store of its own: the data plane meets there from now on.
    std::unique_ptr<comm::kv_store> store;
    const auto store_wait = std::max(
        std::chrono::milliseconds(1000),
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()));
    try {
      store = comm::connect_tcp_store(
          store_host_of(found.answer, e), static_cast<uint16_t>(found.answer.store_port),
          std::min(store_wait, std::chrono::milliseconds(w.cfg.step_timeout_ms)));
    } catch (const std::exception& ex) {
      last = "the store of the coordinator at " + endpoint_name(e) + ": " + ex.what();
      monitoring::log(monitoring::level::warn, w.log_ctx(), last);
      if (clock_type::now() >= deadline) break;
      first = endpoint_after(found.index, w.coordinators.size());
      continue;
    }
    if (w.coordinator) w.self->demonitor(w.coordinator);
    w.coordinator = found.actor;
    w.self->monitor(w.coordinator);
    w.leader = e;
    w.leader_index = found.index;
    w.epoch_seen = found.answer.epoch;
    w.shared->epoch_seen().store(w.epoch_seen);
    w.shared->set_coordinator(w.coordinator);
    w.store = std::move(store);
    if (w.beats) w.beats->retarget(w.coordinator);
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
  w.shared->fence();
  w.shared->abort_older_than(0, true, "the coordinator is gone");
  monitoring::log(monitoring::level::error, w.log_ctx(),
                  why + "; no coordinator took this member back on within " +
                      std::to_string(timeout.count()) + " ms (asked " + joined(asked) +
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
