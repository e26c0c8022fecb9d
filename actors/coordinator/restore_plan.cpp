#include "actors/coordinator/restore_plan.hpp"

#include <algorithm>
#include <optional>
#include <tuple>

#include "strategies/mesh.hpp"

namespace troupe::actors {
namespace {

// What a rank's state depends on besides the step: the sizes that shape each rank's pieces
// and the rank's coordinates along them. Two ranks with equal keys hold the same numbers.
using state_key = std::tuple<int, int, int, int, int, int, int, int>;

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
  //    the choice does not depend on the order reports arrived in).
  std::vector<size_t> order(live.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return live[a].id < live[b].id; });
  std::vector<bool> taken(live.size(), false);
  for (int r = 0; r < world; ++r) {
    const auto want = key_of(next, r, zero);
    for (size_t i : order)
      if (!taken[i] && held[i] && *held[i] == want) {
        taken[i] = true;
        out.member_of_rank[r] = live[i].id;
        break;
      }
  }
  // 2. The other ranks take the remaining members (those holding nothing first) and receive
  //    the state from a rank placed in step 1 with the same key.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return !held[a] && held[b]; });
  bool all_held = true;
  for (int r = 0; r < world; ++r) {
    if (out.member_of_rank[r] >= 0) continue;
    for (size_t i : order)
      if (!taken[i]) {
        taken[i] = true;
        out.member_of_rank[r] = live[i].id;
        break;
      }
    const auto want = key_of(next, r, zero);
    int from = -1;
    for (int s = 0; s < world && from < 0; ++s)
      if (out.source[s] == state_source::self && out.member_of_rank[s] >= 0 && s != r) {
        auto it = std::find_if(live.begin(), live.end(),
                               [&](const member_info& m) { return m.id == out.member_of_rank[s]; });
        const auto i = static_cast<size_t>(it - live.begin());
        if (it != live.end() && held[i] && *held[i] == want) from = s;
      }
    out.source[r] = state_source::peer;
    out.source_rank[r] = from;
    if (from < 0) all_held = false;
  }
  // Ranks placed in step 2 are not sources (their state arrives later), and step 1 ranks
  // that happen to come after them are found above by scanning every rank.
  if (!all_held) {
    // Some piece is held by nobody alive: everyone takes the checkpoint and replays.
    out.start_step = checkpoint_step >= 0 ? checkpoint_step : 0;
    std::fill(out.source.begin(), out.source.end(),
              checkpoint_step >= 0 ? state_source::checkpoint : state_source::init);
    std::fill(out.source_rank.begin(), out.source_rank.end(), -1);
  }
  return out;
}

}  // namespace troupe::actors
