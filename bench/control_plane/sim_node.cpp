#include "bench/control_plane/sim_node.hpp"

#include <algorithm>
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/agent/node_relay.hpp"
#include "actors/wire/connect.hpp"

namespace troupe::bench::control_plane {
namespace {

using beat_atom = caf::atom_constant<caf::atom("sim_beat")>;

struct ticker_state {
  static inline const char* name = "sim_ticker";
};

// Every interval, one heartbeat per live member of the node, sent without a sender as a
// worker's heartbeat thread sends it.
// Aggregated, `to` is the node's relay, which bundles the beats; otherwise the coordinator.
caf::behavior ticker(caf::stateful_actor<ticker_state>* self, caf::actor to,
                     std::vector<int32_t> members, sim_ledger* ledger,
                     std::chrono::milliseconds interval, bool relayed) {
  self->send(self, beat_atom::value);
  return {[=](beat_atom) {
    for (int32_t m : members) {
      auto& rec = ledger->member(m);
      if (!rec.alive.load(std::memory_order_relaxed)) continue;
      actors::heartbeat beat{m, rec.generation.load(std::memory_order_relaxed),
                             rec.commit_step.load(std::memory_order_relaxed), 0};
      caf::anon_send(to, beat);
      if (!relayed) ledger->messages_to_coordinator.fetch_add(1, std::memory_order_relaxed);
      ledger->beats_sent.fetch_add(1, std::memory_order_relaxed);
    }
    self->delayed_send(self, interval, beat_atom::value);
  }};
}

}  // namespace

sim_node::sim_node(node_setup setup) : setup_(std::move(setup)) {
  // One scheduler thread: a node's few members need no more, and the machine's cores belong
  // to the coordinator under test.
  config_.set("scheduler.max-threads", size_t{1});
  config_.use_network();
  system_ = std::make_unique<caf::actor_system>(config_);
}

sim_node::~sim_node() {
  kill_all();
  system_.reset();  // joins the node's threads
}

std::string sim_node::start() {
  auto found = actors::remote_job_actor_until(*system_, setup_.coordinator_host,
                                              setup_.coordinator_port, setup_.connect_deadline);
  if (!found) return system_->render(found.error());
  coordinator_ = *found;
  if (setup_.aggregate) {
    actors::relay_setup r;
    r.coordinator = coordinator_;
    r.vote_window = setup_.vote_window;
    r.beat_interval = setup_.heartbeat_interval;
    r.to_coordinator = &setup_.member.ledger->messages_to_coordinator;
    r.from_coordinator = &setup_.member.ledger->messages_from_coordinator;
    relay_ = system_->spawn(actors::node_relay, r);
  }
  const std::string host = "simnode-" + std::to_string(setup_.node);
  for (int32_t id : setup_.members) {
    member_setup m = setup_.member;
    m.id = id;
    m.node = setup_.node;
    m.host = host;
    m.coordinator = coordinator_;
    m.relay = relay_;
    if (std::find(setup_.slow_members.begin(), setup_.slow_members.end(), id) !=
        setup_.slow_members.end())
      m.slowdown = setup_.slowdown;
    member_actors_.push_back(system_->spawn(sim_member, m));
  }
  ticker_ = system_->spawn(ticker, relay_ ? relay_ : coordinator_, setup_.members,
                           setup_.member.ledger, setup_.heartbeat_interval, bool{relay_});
  return "";
}

bool sim_node::kill_member(int32_t member) {
  for (size_t i = 0; i < setup_.members.size(); ++i) {
    if (setup_.members[i] != member) continue;
    setup_.member.ledger->member(member).alive.store(false);
    caf::anon_send_exit(member_actors_[i], caf::exit_reason::kill);
    return true;
  }
  return false;
}

void sim_node::kill_all() {
  for (int32_t m : setup_.members) setup_.member.ledger->member(m).alive.store(false);
  for (auto& a : member_actors_) caf::anon_send_exit(a, caf::exit_reason::kill);
  for (auto* a : {&ticker_, &relay_})
    if (*a) caf::anon_send_exit(*a, caf::exit_reason::kill);
  member_actors_.clear();
  ticker_ = nullptr;
  relay_ = nullptr;
  coordinator_ = nullptr;
}

}  // namespace troupe::bench::control_plane
