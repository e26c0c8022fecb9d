// The parallel mesh: rank <-> coordinates, groups and pipeline neighbours, checked
// exhaustively for every layout of up to 64 ranks and against hand-written golden tables.

#include "strategies/mesh.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace ts = troupe::strategies;

namespace {

using ranks = std::vector<int>;

// Every well-formed layout of `world` ranks with the given order.
std::vector<ts::layout> layouts_of(int world, const std::string& order) {
  std::vector<ts::layout> out;
  for (int tp = 1; tp <= world; ++tp) {
    if (world % tp) continue;
    for (int pp = 1; pp <= world / tp; ++pp) {
      if ((world / tp) % pp) continue;
      const int dp = world / (tp * pp);
      for (int ep = 1; ep <= dp; ++ep)
        if (dp % ep == 0) out.push_back(ts::layout{dp, tp, pp, ep, order});
    }
  }
  return out;
}

const std::vector<std::string> orders = {"tp-ep-dp-pp", "pp-dp-ep-tp", "dp-tp-pp-ep",
                                         "ep-pp-tp-dp"};

// The coordinate a member of a group of kind `k` varies along.
int along(ts::group_kind k, const ts::coords& c) {
  switch (k) {
    case ts::group_kind::tp:
      return c.tp;
    case ts::group_kind::dp:
      return c.dp;
    case ts::group_kind::pp:
      return c.pp;
    case ts::group_kind::ep:
      return c.ep;
    case ts::group_kind::edp:
      return c.edp;
    case ts::group_kind::embd:
      return c.pp == 0 ? 0 : 1;
  }
  return -1;
}

// Whether two ranks must share a group of kind `k`: equal on every other coordinate.
bool same_group(ts::group_kind k, const ts::coords& a, const ts::coords& b) {
  switch (k) {
    case ts::group_kind::tp:
      return a.dp == b.dp && a.pp == b.pp;
    case ts::group_kind::dp:
      return a.tp == b.tp && a.pp == b.pp;
    case ts::group_kind::pp:
      return a.dp == b.dp && a.tp == b.tp;
    case ts::group_kind::ep:
      return a.tp == b.tp && a.pp == b.pp && a.edp == b.edp;
    case ts::group_kind::edp:
      return a.tp == b.tp && a.pp == b.pp && a.ep == b.ep;
    case ts::group_kind::embd:
      return a.dp == b.dp && a.tp == b.tp;
  }
  return false;
}

int expected_size(ts::group_kind k, const ts::layout& l) {
  switch (k) {
    case ts::group_kind::tp:
      return l.tp;
    case ts::group_kind::dp:
      return l.dp;
    case ts::group_kind::pp:
      return l.pp;
    case ts::group_kind::ep:
      return l.ep;
    case ts::group_kind::edp:
      return l.dp / l.ep;
    case ts::group_kind::embd:
      return l.pp > 1 ? 2 : 1;
  }
  return -1;
}

}  // namespace

TEST(Mesh, GoldenWorld8Tp2Pp2) {
  // The documented table: tp fastest, then dp, then pp.
  const ts::layout l{2, 2, 2, 1};
  struct row {
    int dp, tp, pp;
  };
  const row table[8] = {{0, 0, 0}, {0, 1, 0}, {1, 0, 0}, {1, 1, 0},
                        {0, 0, 1}, {0, 1, 1}, {1, 0, 1}, {1, 1, 1}};
  for (int r = 0; r < 8; ++r) {
    const auto c = ts::coords_of(l, r);
    EXPECT_EQ(c.dp, table[r].dp) << r;
    EXPECT_EQ(c.tp, table[r].tp) << r;
    EXPECT_EQ(c.pp, table[r].pp) << r;
    EXPECT_EQ(c.ep, 0);
    EXPECT_EQ(c.edp, c.dp);
    EXPECT_EQ(ts::rank_of(l, c), r);
  }
  const auto names_and_ranks = [&](ts::group_kind k) {
    std::vector<std::pair<std::string, ranks>> out;
    for (const auto& g : ts::groups_of(l, k)) out.emplace_back(g.name, g.ranks);
    return out;
  };
  using nr = std::vector<std::pair<std::string, ranks>>;
  EXPECT_EQ(names_and_ranks(ts::group_kind::tp), (nr{{"tp.pp0.dp0", {0, 1}},
                                                     {"tp.pp0.dp1", {2, 3}},
                                                     {"tp.pp1.dp0", {4, 5}},
                                                     {"tp.pp1.dp1", {6, 7}}}));
  EXPECT_EQ(names_and_ranks(ts::group_kind::dp), (nr{{"dp.pp0.tp0", {0, 2}},
                                                     {"dp.pp0.tp1", {1, 3}},
                                                     {"dp.pp1.tp0", {4, 6}},
                                                     {"dp.pp1.tp1", {5, 7}}}));
  EXPECT_EQ(names_and_ranks(ts::group_kind::pp), (nr{{"pp.dp0.tp0", {0, 4}},
                                                     {"pp.dp0.tp1", {1, 5}},
                                                     {"pp.dp1.tp0", {2, 6}},
                                                     {"pp.dp1.tp1", {3, 7}}}));
  EXPECT_EQ(names_and_ranks(ts::group_kind::embd), (nr{{"embd.dp0.tp0", {0, 4}},
                                                       {"embd.dp0.tp1", {1, 5}},
                                                       {"embd.dp1.tp0", {2, 6}},
                                                       {"embd.dp1.tp1", {3, 7}}}));

  const auto v = ts::view_of(l, 3);
  EXPECT_EQ(v.tp.name, "tp.pp0.dp1");
  EXPECT_EQ(v.tp.ranks, (ranks{2, 3}));
  EXPECT_EQ(v.tp.index, 1);
  EXPECT_EQ(v.dp.ranks, (ranks{1, 3}));
  EXPECT_EQ(v.dp.index, 1);
  EXPECT_EQ(v.pp.ranks, (ranks{3, 7}));
  EXPECT_EQ(v.pp.index, 0);
  EXPECT_EQ(v.ep.ranks, (ranks{3}));
  EXPECT_EQ(v.edp.ranks, (ranks{1, 3}));
  EXPECT_FALSE(v.prev_stage.has_value());
  EXPECT_EQ(v.next_stage, 7);
  EXPECT_EQ(ts::view_of(l, 7).prev_stage, 3);
  EXPECT_FALSE(ts::view_of(l, 7).next_stage.has_value());
  EXPECT_EQ(ts::describe(l), "dp2xtp2xpp2");
  EXPECT_EQ(ts::to_json(l),
            R"({"dp":2,"tp":2,"pp":2,"ep":1,"order":"tp-ep-dp-pp","name":"dp2xtp2xpp2"})");
}

TEST(Mesh, GoldenExpertGroupsLieInsideDpGroups) {
  // dp4 x tp2, ep2: rank = tp + 2 * (e + 2 * x); dp = e + 2 * x = rank / 2.
  const ts::layout l{4, 2, 1, 2};
  for (int r = 0; r < 8; ++r) {
    const auto c = ts::coords_of(l, r);
    EXPECT_EQ(c.tp, r % 2);
    EXPECT_EQ(c.ep, (r / 2) % 2);
    EXPECT_EQ(c.edp, r / 4);
    EXPECT_EQ(c.dp, r / 2);
  }
  const auto v = ts::view_of(l, 5);  // tp1, e0, x1, dp2
  EXPECT_EQ(v.dp.ranks, (ranks{1, 3, 5, 7}));
  EXPECT_EQ(v.ep.name, "ep.pp0.tp1.edp1");
  EXPECT_EQ(v.ep.ranks, (ranks{5, 7}));
  EXPECT_EQ(v.ep.index, 0);
  EXPECT_EQ(v.edp.name, "edp.pp0.tp1.ep0");
  EXPECT_EQ(v.edp.ranks, (ranks{1, 5}));
  EXPECT_EQ(v.edp.index, 1);
  EXPECT_EQ(ts::describe(l), "dp4xtp2xpp1xep2");
}

TEST(Mesh, EveryLayoutUpTo64RanksIsConsistent) {
  for (const auto& order : orders) {
    for (int world = 1; world <= 64; ++world) {
      for (const auto& l : layouts_of(world, order)) {
        SCOPED_TRACE(ts::describe(l) + " order " + order);
        ASSERT_EQ(ts::check_layout(l), "");
        ASSERT_EQ(l.world(), world);
        // Coordinates: in range, unique, and back to the same rank.
        std::vector<ts::coords> at;
        std::set<std::tuple<int, int, int>> seen;
        for (int r = 0; r < world; ++r) {
          const auto c = ts::coords_of(l, r);
          ASSERT_TRUE(c.dp >= 0 && c.dp < l.dp && c.tp >= 0 && c.tp < l.tp && c.pp >= 0 &&
                      c.pp < l.pp && c.ep >= 0 && c.ep < l.ep && c.edp >= 0 && c.edp < l.dp / l.ep);
          ASSERT_EQ(c.dp, c.ep + l.ep * c.edp);
          ASSERT_TRUE(seen.insert({c.dp, c.tp, c.pp}).second) << "rank " << r;
          ASSERT_EQ(ts::rank_of(l, c), r);
          at.push_back(c);
        }
        std::set<std::string> all_names;
        for (auto k : ts::all_group_kinds) {
          const auto groups = ts::groups_of(l, k);
          std::vector<int> covered(static_cast<size_t>(world), 0);
          for (const auto& g : groups) {
            ASSERT_TRUE(all_names.insert(g.name).second) << "duplicate name " << g.name;
            ASSERT_EQ(g.name.rfind(std::string(ts::to_string(k)) + ".", 0), 0u) << g.name;
            ASSERT_EQ(static_cast<int>(g.ranks.size()), expected_size(k, l)) << g.name;
            ASSERT_EQ(g.index, -1);
            for (size_t i = 0; i < g.ranks.size(); ++i) {
              const int r = g.ranks[i];
              ASSERT_TRUE(r >= 0 && r < world);
              ++covered[static_cast<size_t>(r)];
              // Ordered by the group's axis, and agreeing on every other coordinate.
              ASSERT_EQ(along(k, at[static_cast<size_t>(r)]), static_cast<int>(i)) << g.name;
              ASSERT_TRUE(same_group(k, at[static_cast<size_t>(r)],
                                     at[static_cast<size_t>(g.ranks.front())]));
              // The member's own view of its group is this group, with its index.
              const auto mine = ts::group_of(l, r, k);
              ASSERT_TRUE(mine.has_value());
              ASSERT_EQ(mine->name, g.name);
              ASSERT_EQ(mine->ranks, g.ranks);
              ASSERT_EQ(mine->index, static_cast<int>(i));
            }
          }
          for (int r = 0; r < world; ++r) {
            const int p = at[static_cast<size_t>(r)].pp;
            const bool in_embd = p == 0 || p == l.pp - 1;
            const int want = k == ts::group_kind::embd && !in_embd ? 0 : 1;
            ASSERT_EQ(covered[static_cast<size_t>(r)], want)
                << "rank " << r << " in " << ts::to_string(k);
          }
        }
        // Pipeline neighbours: one stage apart in the same pipeline, and mutual.
        for (int r = 0; r < world; ++r) {
          const auto v = ts::view_of(l, r);
          ASSERT_EQ(v.prev_stage.has_value(), v.at.pp > 0);
          ASSERT_EQ(v.next_stage.has_value(), v.at.pp < l.pp - 1);
          if (v.next_stage) {
            const auto n = ts::coords_of(l, *v.next_stage);
            ASSERT_EQ(n.pp, v.at.pp + 1);
            ASSERT_TRUE(same_group(ts::group_kind::pp, n, v.at));
            ASSERT_EQ(ts::view_of(l, *v.next_stage).prev_stage, r);
          }
          ASSERT_EQ(v.embd.has_value(), v.at.pp == 0 || v.at.pp == l.pp - 1);
        }
      }
    }
  }
}

TEST(Mesh, DefaultOrderKeepsTensorPeersAdjacentAndDpGroupsAscending) {
  for (int world = 1; world <= 64; ++world) {
    for (const auto& l : layouts_of(world, std::string(ts::default_rank_order))) {
      for (const auto& g : ts::groups_of(l, ts::group_kind::tp)) {
        for (size_t i = 1; i < g.ranks.size(); ++i) ASSERT_EQ(g.ranks[i], g.ranks[i - 1] + 1);
        ASSERT_EQ(g.ranks.front() % l.tp, 0);
      }
      for (auto k :
           {ts::group_kind::dp, ts::group_kind::ep, ts::group_kind::edp, ts::group_kind::pp})
        for (const auto& g : ts::groups_of(l, k))
          ASSERT_TRUE(std::is_sorted(g.ranks.begin(), g.ranks.end())) << g.name;
      // Pipeline stages are the slowest axis: stage s holds ranks [s * n, (s + 1) * n).
      const int per_stage = l.world() / l.pp;
      for (int r = 0; r < l.world(); ++r) ASSERT_EQ(ts::coords_of(l, r).pp, r / per_stage);
    }
  }
}

TEST(Mesh, NamesDependOnlyOnSharedCoordinates) {
  // The same group in two orders has the same name and members up to the rank numbering.
  const ts::layout a{4, 2, 2, 2, "tp-ep-dp-pp"};
  const ts::layout b{4, 2, 2, 2, "pp-dp-ep-tp"};
  for (auto k : ts::all_group_kinds) {
    std::map<std::string, std::vector<std::tuple<int, int, int>>> by_name_a, by_name_b;
    for (const auto& g : ts::groups_of(a, k))
      for (int r : g.ranks) {
        const auto c = ts::coords_of(a, r);
        by_name_a[g.name].emplace_back(c.dp, c.tp, c.pp);
      }
    for (const auto& g : ts::groups_of(b, k))
      for (int r : g.ranks) {
        const auto c = ts::coords_of(b, r);
        by_name_b[g.name].emplace_back(c.dp, c.tp, c.pp);
      }
    EXPECT_EQ(by_name_a, by_name_b) << ts::to_string(k);
  }
}

TEST(Mesh, DeterministicAndPure) {
  const ts::layout l{8, 2, 4, 4};
  for (int r = 0; r < l.world(); ++r) {
    const auto a = ts::view_of(l, r);
    const auto b = ts::view_of(l, r);
    EXPECT_EQ(a.at, b.at);
    EXPECT_EQ(a.tp, b.tp);
    EXPECT_EQ(a.dp, b.dp);
    EXPECT_EQ(a.pp, b.pp);
    EXPECT_EQ(a.ep, b.ep);
    EXPECT_EQ(a.edp, b.edp);
    EXPECT_EQ(a.embd, b.embd);
    EXPECT_EQ(a.prev_stage, b.prev_stage);
    EXPECT_EQ(a.next_stage, b.next_stage);
  }
  for (auto k : ts::all_group_kinds) EXPECT_EQ(ts::groups_of(l, k), ts::groups_of(l, k));
}

TEST(Mesh, MalformedLayoutsAreRejectedWithAReason) {
  EXPECT_NE(ts::check_layout({0, 1, 1, 1}).find(">= 1"), std::string::npos);
  EXPECT_NE(ts::check_layout({4, 1, 1, 3}).find("ep (3) must divide dp (4)"), std::string::npos);
  for (const char* bad : {"", "tp-dp-pp", "tp-ep-dp-pp-tp", "tp-tp-dp-pp", "tp-ep-dp-xx",
                          "tp--ep-dp-pp", "tp-ep-dp-pp-"}) {
    const ts::layout l{1, 1, 1, 1, bad};
    EXPECT_NE(ts::check_layout(l).find("order"), std::string::npos) << bad;
    EXPECT_THROW(ts::coords_of(l, 0), std::invalid_argument) << bad;
    EXPECT_THROW(ts::groups_of(l, ts::group_kind::tp), std::invalid_argument) << bad;
  }
  const ts::layout l{2, 2, 2, 1};
  EXPECT_THROW(ts::coords_of(l, -1), std::invalid_argument);
  EXPECT_THROW(ts::coords_of(l, 8), std::invalid_argument);
  EXPECT_THROW(ts::view_of(l, 8), std::invalid_argument);
  EXPECT_THROW(ts::group_of(l, 8, ts::group_kind::dp), std::invalid_argument);
  EXPECT_THROW(ts::rank_of(l, ts::coords{2, 0, 0, 0, 0}), std::invalid_argument);
  EXPECT_THROW(ts::rank_of(l, ts::coords{0, 0, -1, 0, 0}), std::invalid_argument);
  EXPECT_THROW(ts::require_layout({3, 1, 1, 2}), std::invalid_argument);
}

TEST(Mesh, DescribeNamesEpOnlyWhenUsed) {
  EXPECT_EQ(ts::describe({8, 1, 1, 1}), "dp8xtp1xpp1");
  EXPECT_EQ(ts::describe({4, 2, 1, 2}), "dp4xtp2xpp1xep2");
  EXPECT_EQ(ts::to_json({4, 2, 1, 2, "pp-dp-ep-tp"}),
            R"({"dp":4,"tp":2,"pp":1,"ep":2,"order":"pp-dp-ep-tp","name":"dp4xtp2xpp1xep2"})");
}
