#pragma once
// Aggregation through the agents, the coordinator's half of a commit: the commits of one batch
// of the logic's actions that go to members a relay carries (hello::relay) are gathered and
// sent as one node_commit per relay once the batch is carried out, instead of one commit per
// rank. At 10,000 ranks of 8 per node that is 1,250 messages on the coordinator's I/O thread
// instead of 10,000.

#include <caf/actor.hpp>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "actors/wire/messages.hpp"

namespace troupe::actors {

class relayed_commits {
 public:
  /// `msg` for `member`, carried by `relay`. Commits of different steps to one relay go in
  /// different node_commits.
  void add(const caf::actor& relay, int32_t member, const commit& msg) {
    const auto key = std::make_pair(relay.address(), msg.step);
    auto [it, fresh] = index_.emplace(key, batches_.size());
    if (fresh) {
      batches_.emplace_back(relay, node_commit{});
      batches_.back().second.msg = msg;
    }
    auto& batch = batches_[it->second].second;
    batch.members.push_back(member);
    batch.peer_wait_s.push_back(msg.peer_wait_s);
  }

  bool empty() const { return batches_.empty(); }

  /// Hands every gathered node_commit to `send(relay, node_commit)`, in the order the relays
  /// first appeared, and starts over.
  template <class Send>
  void flush(Send&& send) {
    for (auto& [relay, batch] : batches_) send(relay, std::move(batch));
    batches_.clear();
    index_.clear();
  }

 private:
  std::vector<std::pair<caf::actor, node_commit>> batches_;
  std::map<std::pair<caf::actor_addr, int64_t>, size_t> index_;
};

}  // namespace troupe::actors
