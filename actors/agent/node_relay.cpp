#include "actors/agent/node_relay.hpp"

#include <caf/all.hpp>

namespace troupe::actors {
namespace {

using flush_votes_atom = caf::atom_constant<caf::atom("flushvotes")>;
using flush_beats_atom = caf::atom_constant<caf::atom("flushbeats")>;

void count(std::atomic<uint64_t>* counter) {
  if (counter) counter->fetch_add(1, std::memory_order_relaxed);
}

// The ranks this relay carries in `generation`: the votes a step of it waits for.
size_t ranks_in(const relay_state& s, uint64_t generation) {
  size_t n = 0;
  for (const auto& [id, p] : s.placed) n += p.generation == generation && p.rank >= 0;
  return n;
}

void send_votes(relay_actor* self, std::pair<uint64_t, int64_t> key) {
  auto& s = self->state;
  auto it = s.waiting.find(key);
  if (it == s.waiting.end()) return;
  node_votes bundle{std::move(it->second)};
  s.waiting.erase(it);
  count(s.setup.to_coordinator);
  self->send(s.setup.coordinator, std::move(bundle));
}

// `leader` leads with epoch `epoch` (its own word, a member's or the agent's): a newer leader
// than the relay's (a takeover) is carried to from now on. False for an older one.
bool follow(relay_actor* self, const caf::actor& leader, int64_t epoch) {
  auto& s = self->state;
  if (epoch < s.epoch) return false;
  if (epoch > s.epoch && leader) {
    s.epoch = epoch;
    s.setup.coordinator = leader;
  }
  return true;
}

// A coordinator's own message: dropped (false) when an older leader sent it.
bool from_leader(relay_actor* self, int64_t epoch) {
  return follow(self, caf::actor_cast<caf::actor>(self->current_sender()), epoch);
}

}  // namespace

caf::behavior node_relay(relay_actor* self, relay_setup setup) {
  self->state.setup = std::move(setup);
  // It lives as long as what it serves: the agent that sends (watch_atom, agent), or forever.
  self->set_down_handler([=](caf::down_msg&) { self->quit(); });
  self->delayed_send(self, self->state.setup.beat_interval, flush_beats_atom::value);
  return {
      [=](relay_placed_atom, int32_t member, const caf::actor& who, uint64_t generation,
          int32_t rank, const caf::actor& leader, int64_t epoch) {
        auto& s = self->state;
        follow(self, leader, epoch);
        s.placed[member] = {who, generation, rank};
        // Votes of an older generation will never be counted: the coordinator moved on.
        std::erase_if(s.waiting, [&](const auto& w) { return w.first.first < generation; });
      },
      [=](lead_atom, const caf::actor& coordinator, int32_t beat_interval_ms, int64_t epoch) {
        auto& s = self->state;
        if (beat_interval_ms > 0)
          s.setup.beat_interval = std::chrono::milliseconds(beat_interval_ms);
        if (epoch < s.epoch) return;  // a newer leader has spoken to the relay already
        s.epoch = epoch;
        s.setup.coordinator = coordinator;
      },
      [=](watch_atom, const caf::actor& owner) { self->monitor(owner); },
      [=](const step_done& vote) {
        auto& s = self->state;
        const auto key = std::make_pair(vote.generation, vote.step);
        auto& votes = s.waiting[key];
        votes.push_back(vote);
        if (!vote.ok || votes.size() >= ranks_in(s, vote.generation))
          send_votes(self, key);
        else if (votes.size() == 1)
          self->delayed_send(self, s.setup.vote_window, flush_votes_atom::value, key.first,
                             key.second);
      },
      [=](flush_votes_atom, uint64_t generation, int64_t step) {
        send_votes(self, {generation, step});
      },
      [=](const heartbeat& beat) {
        auto& s = self->state;
        if (beat.member >= 0) {  // a member's: carried in the next bundle
          s.beats[beat.member] = beat;
          return;
        }
        count(s.setup.from_coordinator);  // the coordinator's: every member hears it
        if (!from_leader(self, beat.epoch)) return;
        for (const auto& [id, p] : s.placed) self->send(p.member, beat);
      },
      [=](flush_beats_atom) {
        auto& s = self->state;
        if (!s.beats.empty()) {
          node_beats bundle;
          bundle.beats.reserve(s.beats.size());
          for (auto& [id, beat] : s.beats) bundle.beats.push_back(beat);
          s.beats.clear();
          count(s.setup.to_coordinator);
          self->send(s.setup.coordinator, std::move(bundle));
        }
        self->delayed_send(self, s.setup.beat_interval, flush_beats_atom::value);
      },
      [=](const node_commit& c) {
        auto& s = self->state;
        count(s.setup.from_coordinator);
        if (!from_leader(self, c.msg.epoch)) return;
        for (size_t i = 0; i < c.members.size(); ++i) {
          auto it = s.placed.find(c.members[i]);
          if (it == s.placed.end()) continue;
          commit mine = c.msg;
          if (i < c.peer_wait_s.size()) mine.peer_wait_s = c.peer_wait_s[i];
          self->send(it->second.member, mine);
        }
      },
  };
}

}  // namespace troupe::actors
