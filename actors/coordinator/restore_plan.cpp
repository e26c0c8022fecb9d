#include "actors/coordinator/restore_plan.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "strategies/mesh.hpp"

namespace troupe::actors {
namespace {

// What a rank's state depends on besides the step: the sizes that shape each rank's pieces
// and the rank's coordinates along them. Two ranks with equal keys hold the same numbers.
using state_key = std::tuple<int, int, int, int, int, int, int, int>;

struct state_key_hash {
  size_t operator()(const state_key& k) const {
    size_t h = 0;
    std::apply([&](auto... x) { ((h = h * 1'000'003 + std::hash<int>()(x)), ...); }, k);
    return h;
  }
};

state_key key_of(const strategies::layout_plan& p, int rank, int zero) {
  const auto at = strategies::coords_of(p.shape, rank);
  // ZeRO-1 shards the optimizer over dp, so the dp size and index matter too.
  const int dp_size = zero == 1 ? p.shape.dp : 0, dp_index = zero == 1 ? at.dp : 0;
  return {p.shape.tp, p.shape.pp, p.shape.ep, dp_size, at.tp, at.pp, at.ep, dp_index};
}

}  // namespace

restore_plan plan_restore(const std::vector<member_info>& live,
                          const std::map<uint64_t, strategies::layout_plan>& plans,
                          const strategies::layout_plan& next, int zero, int64_t committed,
                          int64_t checkpoint_step) {
  const int world = next.shape.world();
  restore_plan out;
  out.member_of_rank.assign(world, -1);
  out.source.assign(world, state_source::self);
  out.source_rank.assign(world, -1);
  out.start_step = committed;

  std::vector<state_key> wanted(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) wanted[static_cast<size_t>(r)] = key_of(next, r, zero);
  // Which members hold a usable state, and its key.
  std::vector<std::optional<state_key>> held(live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    const auto& m = live[i];
    auto plan = plans.find(m.held_generation);
    if (m.held_step != committed || m.held_rank < 0 || plan == plans.end() ||
        m.held_rank >= plan->second.shape.world())
      continue;
    held[i] = key_of(plan->second, m.held_rank, zero);
  }
  // 1. Members keep their state where a rank needs exactly it (lowest member id first, so
  //    the choice does not depend on the order reports arrived in). Members holding the same
  //    key are interchangeable, so each key keeps its holders in id order and a rank takes
  //    the first one left.
  std::vector<size_t> order(live.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return live[a].id < live[b].id; });
  struct holders {
    std::vector<size_t> members;  // indices into live, by id
    size_t next_free = 0;
    int first_rank = -1;  // the lowest rank placed here: the peer of the key's other ranks
  };
  std::unordered_map<state_key, holders, state_key_hash> by_key;
  for (size_t i : order)
    if (held[i]) by_key[*held[i]].members.push_back(i);
  std::vector<bool> taken(live.size(), false);
  for (int r = 0; r < world; ++r) {
    auto it = by_key.find(wanted[static_cast<size_t>(r)]);
    if (it == by_key.end() || it->second.next_free == it->second.members.size()) continue;
    auto& h = it->second;
    const size_t i = h.members[h.next_free++];
    taken[i] = true;
    out.member_of_rank[r] = live[i].id;
    if (h.first_rank < 0) h.first_rank = r;
  }
  // 2. The other ranks take the remaining members (those holding nothing first) and receive
  //    the state from a rank placed in step 1 with the same key. Ranks placed in step 2 are
  //    not sources: their state arrives later. Members are taken in `order`, so everything
  //    before the cursor is taken.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return !held[a] && held[b]; });
  size_t cursor = 0;
  bool all_held = true;
  for (int r = 0; r < world; ++r) {
    if (out.member_of_rank[r] >= 0) continue;
    while (cursor < order.size() && taken[order[cursor]]) ++cursor;
    if (cursor < order.size()) {
      taken[order[cursor]] = true;
      out.member_of_rank[r] = live[order[cursor]].id;
    }
    const auto it = by_key.find(wanted[static_cast<size_t>(r)]);
    const int from = it == by_key.end() ? -1 : it->second.first_rank;
    out.source[r] = state_source::peer;
    out.source_rank[r] = from;
    if (from < 0) all_held = false;
  }
  if (!all_held) {
    // Some piece is held by nobody alive: everyone takes the checkpoint and replays.
    out.start_step = checkpoint_step >= 0 ? checkpoint_step : 0;
    std::fill(out.source.begin(), out.source.end(),
              checkpoint_step >= 0 ? state_source::checkpoint : state_source::init);
    std::fill(out.source_rank.begin(), out.source_rank.end(), -1);
  }
  return out;
}

std::vector<std::vector<int32_t>> peer_receivers(const restore_plan& plan) {
  std::vector<std::vector<int32_t>> out(plan.source_rank.size());
  for (size_t r = 0; r < plan.source_rank.size(); ++r) {
    const int32_t from = plan.source_rank[r];
    if (plan.source[r] == state_source::peer && from >= 0 && static_cast<size_t>(from) < out.size())
      out[static_cast<size_t>(from)].push_back(static_cast<int32_t>(r));
  }
  return out;
}

}  // namespace troupe::actors
