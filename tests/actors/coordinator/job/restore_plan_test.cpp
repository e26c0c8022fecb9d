// plan_restore (actors/coordinator/restore_plan.hpp): the plan that buckets members by the state
// they hold against the quadratic search it replaced, kept here as the reference: the same
// members, sources and peers for random jobs, and 100,000 ranks in well under a second.
#include "actors/coordinator/restore_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "strategies/mesh.hpp"

namespace troupe::actors {
namespace {

// ---- the reference: plan_restore as it was before it bucketed (O(N^2), O(N^3) on a grow) ----

using reference_key = std::tuple<int, int, int, int, int, int, int, int>;

reference_key reference_key_of(const strategies::layout_plan& p, int rank, int zero) {
  const auto at = strategies::coords_of(p.shape, rank);
  const int dp_size = zero == 1 ? p.shape.dp : 0, dp_index = zero == 1 ? at.dp : 0;
  return {p.shape.tp, p.shape.pp, p.shape.ep, dp_size, at.tp, at.pp, at.ep, dp_index};
}

restore_plan reference_plan_restore(const std::vector<member_info>& live,
                                    const std::map<uint64_t, strategies::layout_plan>& plans,
                                    const strategies::layout_plan& next, int zero,
                                    int64_t committed, int64_t checkpoint_step) {
  const int world = next.shape.world();
  restore_plan out;
  out.member_of_rank.assign(world, -1);
  out.source.assign(world, state_source::self);
  out.source_rank.assign(world, -1);
  out.start_step = committed;
  std::vector<std::optional<reference_key>> held(live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    const auto& m = live[i];
    auto plan = plans.find(m.held_generation);
    if (m.held_step != committed || m.held_rank < 0 || plan == plans.end() ||
        m.held_rank >= plan->second.shape.world())
      continue;
    held[i] = reference_key_of(plan->second, m.held_rank, zero);
  }
  std::vector<size_t> order(live.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return live[a].id < live[b].id; });
  std::vector<bool> taken(live.size(), false);
  for (int r = 0; r < world; ++r) {
    const auto want = reference_key_of(next, r, zero);
    for (size_t i : order)
      if (!taken[i] && held[i] && *held[i] == want) {
        taken[i] = true;
        out.member_of_rank[r] = live[i].id;
        break;
      }
  }
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
    const auto want = reference_key_of(next, r, zero);
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
  if (!all_held) {
    out.start_step = checkpoint_step >= 0 ? checkpoint_step : 0;
    std::fill(out.source.begin(), out.source.end(),
              checkpoint_step >= 0 ? state_source::checkpoint : state_source::init);
    std::fill(out.source_rank.begin(), out.source_rank.end(), -1);
  }
  return out;
}

// The send lists reconfigure carried before they were inverted once: every rank scanned.
std::vector<std::vector<int32_t>> reference_receivers(const restore_plan& p) {
  std::vector<std::vector<int32_t>> out(p.source_rank.size());
  for (size_t from = 0; from < out.size(); ++from)
    for (size_t r = 0; r < p.source_rank.size(); ++r)
      if (p.source[r] == state_source::peer && p.source_rank[r] == static_cast<int32_t>(from))
        out[from].push_back(static_cast<int32_t>(r));
  return out;
}

// ---- helpers ---------------------------------------------------------------------------------

strategies::layout_plan plan_of_shape(
    int dp, int tp, int pp, int ep,
    std::string order = std::string(strategies::default_rank_order)) {
  strategies::layout_plan p;
  p.shape = {dp, tp, pp, ep, std::move(order)};
  return p;
}

void expect_same(const restore_plan& got, const restore_plan& want, const std::string& what) {
  EXPECT_EQ(got.member_of_rank, want.member_of_rank) << what;
  EXPECT_EQ(got.source, want.source) << what;
  EXPECT_EQ(got.source_rank, want.source_rank) << what;
  EXPECT_EQ(got.start_step, want.start_step) << what;
}

double seconds_of(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// `count` members with distinct ids in a shuffled order, holding nothing.
std::vector<member_info> members(int count, std::mt19937& rng, int32_t first_id = 0) {
  std::vector<member_info> live(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) live[static_cast<size_t>(i)].id = first_id + i;
  std::shuffle(live.begin(), live.end(), rng);
  return live;
}

// Member i (in id order) holds rank i of generation `g` at `step`.
void hold_in_order(std::vector<member_info>& live, uint64_t g, int ranks, int64_t step) {
  for (auto& m : live)
    if (m.id < ranks) {
      m.held_generation = g;
      m.held_rank = m.id;
      m.held_step = step;
    }
}

// ---- equality with the reference -------------------------------------------------------------

TEST(PlanRestore, MatchesTheReferenceOnRandomJobs) {
  std::mt19937 rng(41);
  const std::vector<strategies::layout_plan> shapes = {
      plan_of_shape(1, 1, 1, 1),
      plan_of_shape(4, 1, 1, 1),
      plan_of_shape(6, 1, 1, 1),
      plan_of_shape(2, 2, 1, 1),
      plan_of_shape(3, 1, 2, 1),
      plan_of_shape(2, 2, 2, 1),
      plan_of_shape(4, 1, 1, 2),
      plan_of_shape(4, 2, 1, 2, "dp-tp-pp-ep"),
      plan_of_shape(2, 1, 3, 1, "pp-dp-ep-tp"),
      plan_of_shape(8, 1, 1, 1),
      plan_of_shape(4, 1, 2, 1),
  };
  for (const auto& s : shapes) ASSERT_EQ(strategies::check_layout(s.shape), "");
  const auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  int with_peers = 0, all_kept = 0, from_checkpoint = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    std::map<uint64_t, strategies::layout_plan> plans;
    const int generations = 1 + pick(3);
    for (int g = 1; g <= generations; ++g)
      plans[static_cast<uint64_t>(g)] =
          shapes[static_cast<size_t>(pick(static_cast<int>(shapes.size())))];
    // Often the layout stays as it was, so that many members keep their state.
    const auto& next = pick(3) == 0
                           ? plans.rbegin()->second
                           : shapes[static_cast<size_t>(pick(static_cast<int>(shapes.size())))];
    const int zero = pick(2);
    const int64_t committed = 10 + pick(2);
    const int64_t checkpoint_step = pick(3) == 0 ? -1 : 5;
    // Often one member per rank of the last generation, less a few or with a few joined.
    const int last_world = plans.rbegin()->second.shape.world();
    const int count = std::max(0, last_world + pick(5) - 2 + (pick(4) == 0 ? pick(8) : 0));
    // Ids with gaps, so that id order and index order differ.
    auto live = members(count, rng);
    for (auto& m : live) m.id = m.id * 3 + pick(3);
    std::sort(live.begin(), live.end(),
              [](const member_info& a, const member_info& b) { return a.id < b.id; });
    live.erase(std::unique(live.begin(), live.end(),
                           [](const member_info& a, const member_info& b) { return a.id == b.id; }),
               live.end());
    std::shuffle(live.begin(), live.end(), rng);
    // Half the jobs as after a loss: the members hold the last generation's ranks, one each,
    // with a few exceptions. The others hold anything, usable or not.
    const bool after_loss = pick(2) == 0;
    int next_rank = 0;
    for (auto& m : live) {
      const int what = pick(after_loss ? 40 : 10);
      if (what == 0) continue;                                                  // holds nothing
      const uint64_t g = what == 1    ? static_cast<uint64_t>(generations + 1)  // unknown plan
                         : after_loss ? static_cast<uint64_t>(generations)
                                      : static_cast<uint64_t>(1 + pick(generations));
      const int held_world = plans.count(g) ? plans[g].shape.world() : 4;
      m.held_generation = g;
      m.held_rank = what == 2                              ? held_world
                    : what == 3                            ? -1
                    : after_loss && next_rank < held_world ? next_rank++
                                                           : pick(held_world);
      m.held_step = what == 4 ? committed - 1 : committed;
    }
    const auto got = plan_restore(live, plans, next, zero, committed, checkpoint_step);
    const auto want = reference_plan_restore(live, plans, next, zero, committed, checkpoint_step);
    expect_same(got, want, "trial " + std::to_string(trial));
    EXPECT_EQ(peer_receivers(got), reference_receivers(got)) << trial;
    if (::testing::Test::HasFailure()) return;
    const bool peers = std::count(got.source.begin(), got.source.end(), state_source::peer) > 0;
    with_peers += peers;
    all_kept += !peers && got.source.front() == state_source::self;
    from_checkpoint += got.source.front() == state_source::checkpoint;
  }
  // Each kind of outcome came up often enough for the comparison to mean something.
  EXPECT_GT(with_peers, 200);
  EXPECT_GT(all_kept, 200);
  EXPECT_GT(from_checkpoint, 200);
}

// The three shapes the scale tests run, at a size the reference still finishes quickly.
TEST(PlanRestore, MatchesTheReferenceOnLargerDpZeroAndGrow) {
  std::mt19937 rng(7);
  const int n = 1500;
  std::map<uint64_t, strategies::layout_plan> plans{{1, plan_of_shape(n, 1, 1, 1)},
                                                    {2, plan_of_shape(n / 2, 2, 1, 1)}};
  auto dp = members(n, rng);
  hold_in_order(dp, 1, n, 9);
  for (int zero : {0, 1})
    expect_same(plan_restore(dp, plans, plans[1], zero, 9, 5),
                reference_plan_restore(dp, plans, plans[1], zero, 9, 5),
                "dp, zero " + std::to_string(zero));
  // A grow: half the members held generation 2's ranks, the other half just joined.
  auto grow = members(2 * n, rng);
  hold_in_order(grow, 2, n, 9);
  const auto next = plan_of_shape(n, 2, 1, 1);
  const auto got = plan_restore(grow, plans, next, 0, 9, 5);
  expect_same(got, reference_plan_restore(grow, plans, next, 0, 9, 5), "grow");
  EXPECT_EQ(std::count(got.source.begin(), got.source.end(), state_source::peer), n);
}

// ---- at scale --------------------------------------------------------------------------------

constexpr int big = 100'000;

TEST(PlanRestoreAtScale, PlainDpKeepsEveryMemberInIdOrder) {
  std::mt19937 rng(1);
  std::map<uint64_t, strategies::layout_plan> plans{{1, plan_of_shape(big, 1, 1, 1)}};
  auto live = members(big, rng);
  hold_in_order(live, 1, big, 9);
  restore_plan got;
  const double took = seconds_of([&] { got = plan_restore(live, plans, plans[1], 0, 9, 5); });
  EXPECT_LT(took, 2.0);
  std::cout << "plan_restore, dp " << big << ": " << took << " s\n";
  for (int r = 0; r < big; ++r) {
    ASSERT_EQ(got.member_of_rank[static_cast<size_t>(r)], r);
    ASSERT_EQ(got.source[static_cast<size_t>(r)], state_source::self);
  }
}

TEST(PlanRestoreAtScale, ZeroOneKeepsEachShardWhereItIs) {
  std::mt19937 rng(2);
  std::map<uint64_t, strategies::layout_plan> plans{{1, plan_of_shape(big / 2, 2, 1, 1)}};
  auto live = members(big, rng);
  // Member ids run against the ranks, so nobody keeps its place by index.
  for (auto& m : live) {
    m.held_generation = 1;
    m.held_rank = big - 1 - m.id;
    m.held_step = 9;
  }
  restore_plan got;
  const double took = seconds_of([&] { got = plan_restore(live, plans, plans[1], 1, 9, 5); });
  EXPECT_LT(took, 2.0);
  std::cout << "plan_restore, ZeRO-1 " << big << ": " << took << " s\n";
  for (int r = 0; r < big; ++r) {
    ASSERT_EQ(got.member_of_rank[static_cast<size_t>(r)], big - 1 - r);
    ASSERT_EQ(got.source[static_cast<size_t>(r)], state_source::self);
  }
}

TEST(PlanRestoreAtScale, AGrowSendsHalfTheRanksTheirStateFromPeers) {
  std::mt19937 rng(3);
  const int held = big / 2;
  std::map<uint64_t, strategies::layout_plan> plans{{1, plan_of_shape(held / 2, 2, 1, 1)}};
  auto live = members(big, rng);
  hold_in_order(live, 1, held, 9);
  const auto next = plan_of_shape(big / 2, 2, 1, 1);
  restore_plan got;
  std::vector<std::vector<int32_t>> receivers;
  const double took = seconds_of([&] {
    got = plan_restore(live, plans, next, 0, 9, 5);
    receivers = peer_receivers(got);
  });
  EXPECT_LT(took, 2.0);
  std::cout << "plan_restore + peer_receivers, grow to " << big << ": " << took << " s\n";
  // The first ranks keep the holders; each later rank is a newcomer, sent the state by the
  // first rank of its tp index.
  for (int r = 0; r < big; ++r) {
    const auto i = static_cast<size_t>(r);
    ASSERT_EQ(got.member_of_rank[i], r);
    ASSERT_EQ(got.source[i], r < held ? state_source::self : state_source::peer) << r;
    ASSERT_EQ(got.source_rank[i], r < held ? -1 : r % 2) << r;
  }
  ASSERT_EQ(receivers[0].size() + receivers[1].size(), static_cast<size_t>(big - held));
  EXPECT_EQ(receivers[0].front(), held);
  EXPECT_EQ(receivers[1].back(), big - 1);
  EXPECT_TRUE(std::is_sorted(receivers[0].begin(), receivers[0].end()));
}

}  // namespace
}  // namespace troupe::actors
