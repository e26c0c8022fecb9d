// Whom a takeover still waits for (actors/coordinator/job/takeover_roll.hpp): its counts
// against a scan of every member through random rejoins, losses and newer generations, and a
// takeover of 200,000 members whose every rejoin is O(1).

#include "actors/coordinator/job/takeover_roll.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

namespace troupe::actors {
namespace {

// The roll as job_logic computed it before: a pass over every member on each rejoin.
struct scanned_roll {
  std::map<int32_t, bool> back;
  uint64_t generation = 0;
  int world = 0;

  bool everyone_back() const {
    for (const auto& [m, b] : back)
      if (!b) return false;
    return true;
  }
  bool every_rank_held(const std::vector<member_info>& members) const {
    if (generation == 0) return false;
    std::vector<bool> held(static_cast<size_t>(world), false);
    for (const auto& m : members)
      if (m.live && m.held_generation == generation && m.held_rank >= 0 && m.held_rank < world)
        held[static_cast<size_t>(m.held_rank)] = true;
    return std::all_of(held.begin(), held.end(), [](bool b) { return b; });
  }
};

TEST(TakeoverRoll, AgreesWithAScanThroughRejoinsLossesAndNewerGenerations) {
  for (unsigned seed = 1; seed <= 30; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    auto pick = [&](int hi) { return std::uniform_int_distribution<int>(0, hi)(rng); };
    constexpr int ids = 12;
    std::vector<member_info> members(ids);
    for (int32_t i = 0; i < ids; ++i) {
      members[static_cast<size_t>(i)].id = i;
      members[static_cast<size_t>(i)].live = false;
    }
    takeover_roll roll;
    scanned_roll ref;
    for (int op = 0; op < 300; ++op) {
      const int32_t id = pick(ids - 1);
      member_info& m = members[static_cast<size_t>(id)];
      switch (pick(4)) {
        case 0:  // an agent names it
          roll.wait_for(id);
          ref.back.try_emplace(id, false);
          break;
        case 1:  // it rejoins with what it holds, maybe naming a newer generation
          if (m.live) break;
          m.live = true;
          m.held_generation = static_cast<uint64_t>(1 + pick(3));
          m.held_rank = pick(6) - 1;
          roll.back(id);
          ref.back[id] = true;
          if (m.held_generation > ref.generation) {
            ref.generation = m.held_generation;
            ref.world = 2 + pick(4);
            roll.hold_against(ref.generation, ref.world, members);
          } else {
            roll.holder(m, 1);
          }
          break;
        case 2:  // lost
          if (!m.live) break;
          m.live = false;
          roll.forget(id);
          roll.holder(m, -1);
          ref.back.erase(id);
          break;
        case 3:  // its process ended before it rejoined
          if (m.live) break;
          roll.forget(id);
          ref.back.erase(id);
          break;
        default:  // a rejoin that names no state
          if (m.live) break;
          m.live = true;
          m.held_generation = 0;
          m.held_rank = -1;
          roll.back(id);
          ref.back[id] = true;
          roll.holder(m, 1);
      }
      ASSERT_EQ(roll.everyone_back(), ref.everyone_back()) << "op " << op;
      ASSERT_EQ(roll.every_rank_held(), ref.every_rank_held(members)) << "op " << op;
    }
  }
}

TEST(TakeoverRoll, EveryRejoinOfAHugeJobIsConstantTime) {
  constexpr int n = 200'000;
  std::vector<member_info> members(n);
  takeover_roll roll;
  for (int32_t i = 0; i < n; ++i) {
    members[static_cast<size_t>(i)].live = false;
    roll.wait_for(i);
  }
  const auto start = std::chrono::steady_clock::now();
  int decided_early = 0;
  for (int32_t i = 0; i < n; ++i) {
    member_info& m = members[static_cast<size_t>(i)];
    m.id = i;
    m.live = true;
    m.held_generation = 5;
    m.held_rank = n - 1 - i;
    roll.back(i);
    if (i == 0)
      roll.hold_against(5, n, members);
    else
      roll.holder(m, 1);
    // What maybe_finish_takeover asks on every rejoin.
    decided_early += (roll.everyone_back() || roll.every_rank_held()) && i < n - 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(decided_early, 0);
  EXPECT_TRUE(roll.everyone_back());
  EXPECT_TRUE(roll.every_rank_held());
  EXPECT_LT(seconds, 2.0);
  roll.holder(members[7], -1);  // lost: its rank is held by nobody now
  EXPECT_FALSE(roll.every_rank_held());
}

}  // namespace
}  // namespace troupe::actors
