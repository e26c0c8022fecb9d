// A job of more ranks than metrics_rank_labels logs where its ranks' state came from as one
// restored_summary per generation, not a restored event per rank (issue 41: ten thousand lines
// per recovery); at the threshold and below, a line per rank as before. Driven through
// job_logic, as the supervisor drives it.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "actors/coordinator/job_logic.hpp"
#include "tests/actors/coordinator/logic_test_support.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using test_support::all_of;

const logic_time t0 = logic_time{} + 1000s;

// A data-parallel job of `world` ranks whose members all join and reconfigure, rank r saying
// it restored 1000 * (r + 1) bytes in r + 1 seconds; what its formation emitted.
std::vector<events::job_event> form(int world, int rank_labels) {
  job_params p;
  p.cfg = test_support::small_config(world);
  p.cfg.metrics_rank_labels = rank_labels;
  p.plan = strategies::plan_of(strategies::plan_layout(world, p.cfg));
  p.members = world;
  p.bounds.min_ranks = 1;
  p.bounds.max_ranks = world;
  job_logic logic(p, t0);
  std::vector<send_reconfigure> sent;
  for (int32_t id = 0; id < world; ++id) {
    hello h;
    h.member = id;
    h.pid = 100 + id;
    h.host = "test";
    welcome w;
    for (auto& r : all_of<send_reconfigure>(logic.on_member_joined(h, t0, w)))
      sent.push_back(std::move(r));
  }
  EXPECT_EQ(sent.size(), static_cast<size_t>(world));
  std::vector<events::job_event> emitted;
  for (const auto& r : sent) {
    reconfigured done;
    done.generation = r.msg.generation;
    done.member = r.member;
    done.rank = r.msg.rank;
    done.bytes = 1000 * static_cast<uint64_t>(r.msg.rank + 1);
    done.seconds = r.msg.rank + 1.0;
    done.memory_bytes = 10;
    for (auto& e : all_of<emit_event>(logic.on_reconfigured(done, t0 + 1s)))
      emitted.push_back(std::move(e.event));
  }
  EXPECT_EQ(logic.state(), job_state::training);
  return emitted;
}

size_t count_of(const std::vector<events::job_event>& emitted, const std::string& kind) {
  return static_cast<size_t>(std::count_if(emitted.begin(), emitted.end(),
                                           [&](const auto& e) { return events::kind(e) == kind; }));
}

TEST(EventSummaries, AtTheRankLabelsEachRankSaysWhereItsStateCameFrom) {
  const auto emitted = form(4, 4);
  EXPECT_EQ(count_of(emitted, "restored"), 4u);
  EXPECT_EQ(count_of(emitted, "restored_summary"), 0u);
}

TEST(EventSummaries, AboveTheRankLabelsOneSummaryTellsItForAllRanks) {
  const auto emitted = form(4, 3);
  EXPECT_EQ(count_of(emitted, "restored"), 0u);
  ASSERT_EQ(count_of(emitted, "restored_summary"), 1u);
  const auto it = std::find_if(emitted.begin(), emitted.end(), [](const auto& e) {
    return std::holds_alternative<events::restored_summary>(e);
  });
  const auto& e = std::get<events::restored_summary>(*it);
  EXPECT_EQ(e.generation, 1u);
  EXPECT_EQ(e.step, 0);
  EXPECT_EQ(e.ranks, 4);
  EXPECT_EQ(e.from, (std::map<std::string, int32_t>{{"init", 4}}));
  EXPECT_EQ(e.bytes, 10000u);
  EXPECT_EQ(e.from_memory_bytes, 40u);
  // Of an even count, the lower middle value.
  EXPECT_EQ(e.rank_bytes, (events::spread<uint64_t>{1000, 2000, 4000}));
  EXPECT_EQ(e.rank_seconds, (events::spread<double>{1.0, 2.0, 4.0}));
  EXPECT_FALSE(e.checkpoint_step);
  // The generation follows it, as it follows the per-rank lines.
  EXPECT_EQ(count_of(emitted, "generation"), 1u);
}

}  // namespace
}  // namespace troupe::actors
