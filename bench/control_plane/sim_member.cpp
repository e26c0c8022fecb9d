#include "bench/control_plane/sim_member.hpp"

#include <caf/all.hpp>
#include <chrono>

#include "actors/agent/node_relay.hpp"
#include "actors/wire/messages.hpp"
#include "actors/wire/welcome_verdict.hpp"

namespace troupe::bench::control_plane {
namespace {

using namespace troupe::actors;
using vote_atom = caf::atom_constant<caf::atom("sim_vote")>;

// Schedules this member's vote for `step` of its generation after its simulated compute.
void schedule_vote(member_actor* self, int64_t step) {
  auto& s = self->state;
  int ms = s.setup.step_ms;
  if (s.setup.jitter_ms > 0)
    ms += std::uniform_int_distribution<int>(-s.setup.jitter_ms, s.setup.jitter_ms)(s.rng);
  ms = static_cast<int>(static_cast<double>(std::max(0, ms)) * s.setup.slowdown);
  self->delayed_send(self, std::chrono::milliseconds(ms), vote_atom::value, s.generation, step);
}

// Takes its place in a generation: answers at once (nothing to build or restore) and, with a
// rank, starts computing the generation's first step.
void enter(member_actor* self, const reconfigure& r) {
  auto& s = self->state;
  if (from_older_epoch(r.epoch, s.epoch) || r.generation < s.generation) return;
  s.epoch = r.epoch;
  s.generation = r.generation;
  s.rank = r.rank;
  s.world = r.world;
  s.committed = r.start_step;
  auto& rec = s.setup.ledger->member(s.setup.id);
  rec.generation.store(r.generation);
  rec.rank.store(r.rank);
  rec.placed_ns.store(now_ns());
  s.setup.ledger->reconfigures.fetch_add(1, std::memory_order_relaxed);
  reconfigured done;
  done.generation = r.generation;
  done.member = s.setup.id;
  done.rank = r.rank;
  self->send(s.setup.coordinator, done);
  s.held_generation = r.generation;
  s.held_rank = r.rank;
  if (s.setup.relay)
    self->send(s.setup.relay, relay_placed_atom::value, s.setup.id, caf::actor{self}, r.generation,
               r.rank, s.setup.coordinator, s.epoch);
  if (r.rank >= 0) schedule_vote(self, r.start_step + 1);
}

void leave(member_actor* self) {
  self->state.setup.ledger->member(self->state.setup.id).alive.store(false);
  self->quit();
}

}  // namespace

caf::behavior sim_member(member_actor* self, member_setup setup) {
  self->state.setup = std::move(setup);
  self->state.rng.seed(static_cast<uint32_t>(self->state.setup.id) * 2654435761u + 1);
  const auto& st = self->state.setup;
  // No data plane: it asks for the null one, as the real workers of a mixed job do
  // (TROUPE_TRANSPORT=null), so that the coordinator names one transport for the group.
  const std::string transport = "null\n" + st.host;
  hello greeting{protocol_version, st.id, fake_pid(st.id), st.host, st.node, self, transport};
  greeting.relay = st.relay;
  self->request(st.coordinator, std::chrono::seconds(st.hello_timeout_s), greeting)
      .then(
          [=](const welcome& w) {
            auto& s = self->state;
            if (!w.error.empty()) {
              s.setup.ledger->refusals.fetch_add(1);
              return leave(self);
            }
            s.epoch = w.epoch;
            s.shares = process_share_writer(w.config_json, *s.setup.ledger, s.shares_error);
            s.setup.ledger->member(s.setup.id).welcomed.store(true);
          },
          [=](caf::error&) {
            self->state.setup.ledger->refusals.fetch_add(1);
            leave(self);
          });
  return {
      [=](const reconfigure& r) { enter(self, r); },
      [=](vote_atom, uint64_t generation, int64_t step) {
        auto& s = self->state;
        if (generation != s.generation || s.rank < 0) return;  // aborted meanwhile
        step_done vote;
        vote.generation = generation;
        vote.step = step;
        vote.rank = s.rank;
        vote.tokens = 16;
        vote.loss_sum = 2.0 * 16;
        vote.grad_norm = 1;
        vote.lr = 1e-3;
        vote.compute_s = vote.compute_cpu_s = s.setup.step_ms / 1000.0;
        if (auto* rec = s.setup.ledger->step(step)) store_max(rec->last_vote_ns, now_ns());
        s.setup.ledger->votes_sent.fetch_add(1, std::memory_order_relaxed);
        if (s.setup.relay) {
          self->send(s.setup.relay, vote);
        } else {
          s.setup.ledger->messages_to_coordinator.fetch_add(1, std::memory_order_relaxed);
          self->send(s.setup.coordinator, vote);
        }
      },
      [=](const commit& c) {
        auto& s = self->state;
        if (from_older_epoch(c.epoch, s.epoch) || c.generation != s.generation) return;
        const int64_t t = now_ns();
        s.committed = c.step;
        auto& rec = s.setup.ledger->member(s.setup.id);
        rec.commit_generation.store(c.generation);
        rec.commit_step.store(c.step);
        rec.commit_ns.store(t);
        s.setup.ledger->commits_received.fetch_add(1, std::memory_order_relaxed);
        if (!s.setup.relay)
          s.setup.ledger->messages_from_coordinator.fetch_add(1, std::memory_order_relaxed);
        if (auto* step = s.setup.ledger->step(c.step)) {
          store_max(step->last_commit_ns, t);
          step->commits.fetch_add(1, std::memory_order_relaxed);
        }
        if (c.checkpoint) {
          // The rank's share, written in the background as a rank's checkpointer writes it;
          // the report goes to the coordinator from the writer's thread.
          if (s.shares) {
            s.shares->enqueue({s.rank, s.world, c.generation, c.step, s.setup.coordinator});
          } else {
            shard_written w;
            w.generation = c.generation;
            w.step = c.step;
            w.rank = s.rank;
            w.ok = false;
            w.error = s.shares_error;
            self->send(s.setup.coordinator, w);
          }
        }
        if (c.evaluate) self->send(s.setup.coordinator, eval_done{c.generation, c.step, s.rank});
        if (!c.hold) schedule_vote(self, c.step + 1);
      },
      [=](const abort_generation& a) {
        auto& s = self->state;
        if (from_older_epoch(a.epoch, s.epoch)) return;
        s.setup.ledger->aborts.fetch_add(1, std::memory_order_relaxed);
        if (a.final) {
          s.setup.ledger->stops.fetch_add(1);
          return leave(self);
        }
        s.generation = a.generation;  // votes of the old generation are dropped
        if (!a.then.empty()) return enter(self, a.then.front());
        state_report held;
        held.generation = a.generation;
        held.member = s.setup.id;
        held.held_generation = s.held_generation;
        held.held_rank = s.held_rank;
        held.held_step = s.held_generation > 0 ? s.committed : -1;
        s.setup.ledger->reports.fetch_add(1, std::memory_order_relaxed);
        self->send(s.setup.coordinator, held);
      },
      [=](const heartbeat& h) {
        auto& s = self->state;
        if (!from_older_epoch(h.epoch, s.epoch)) s.epoch = h.epoch;
        s.setup.ledger->beats_received.fetch_add(1, std::memory_order_relaxed);
        if (!s.setup.relay)
          s.setup.ledger->messages_from_coordinator.fetch_add(1, std::memory_order_relaxed);
      },
      [=](stop_atom) {
        self->state.setup.ledger->stops.fetch_add(1);
        leave(self);
      },
  };
}

}  // namespace troupe::bench::control_plane
