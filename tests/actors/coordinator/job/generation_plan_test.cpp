// generation_plan's reconfigures (actors/coordinator/job/generation_plan.hpp) and the plan they
// carry: each member's send list against the scan over every rank it replaced, 100,000 ranks
// in well under a second, and a plan whose text stays small however many replicas it has,
// read back exactly, in today's form and in the per-replica list older writers sent.
#include "actors/coordinator/job/generation_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "actors/coordinator/job/membership.hpp"
#include "strategies/planner.hpp"
#include "strategies/replan.hpp"
#include "tests/actors/coordinator/logic_test_support.hpp"

namespace troupe::actors {
namespace {

using test_support::all_of;

// An even plan of `dp` replicas of one micro-batch each, as make_plan makes it less the
// estimates (which take seconds for tens of thousands of replicas).
strategies::layout_plan plan_for(int dp, int tp = 1) {
  strategies::layout_plan p;
  p.shape = {dp, tp, 1, 1};
  p.stages = {{0, test_support::small_config(1).model.n_layer}};
  p.micro_batches = dp;
  p.micro_batch_size = 2;
  p.micro_batches_per_replica = 1;
  p.replica_micro_batches.assign(static_cast<size_t>(dp), 1);
  p.bubble = 0.25;
  p.params_per_rank = 123456.5;
  p.step_seconds = 0.1 + 0.2;
  return p;
}

job_params params_for(const strategies::layout_plan& first, int members) {
  job_params p;
  p.cfg = test_support::small_config(first.shape.world());
  p.members = members;
  p.plan = first;
  return p;
}

// A job of `count` members, `per_node` to a host, each holding what `held` says (its rank of
// generation 1 at step 9, or nothing), placed for generation 2 on `next`.
struct formed_job {
  formed_job(const strategies::layout_plan& first_plan, int count)
      : first(first_plan),
        params(params_for(first_plan, count)),
        members(params),
        generations(params) {}

  void form(const strategies::layout_plan& next, int per_node,
            const std::function<int(int32_t)>& held) {
    const int count = params.members;
    actions ignored;
    for (int32_t id = 0; id < count; ++id) {
      hello h;
      h.member = id;
      h.pid = 1000 + id;
      h.node = id / per_node;
      h.host = "host" + std::to_string(h.node);
      h.transport = "auto\n" + h.host;
      welcome w;
      ASSERT_NE(members.admit(h, true, false, logic_time{}, w, ignored), nullptr) << w.error;
      const int rank = held(id);
      ASSERT_TRUE(members.report(
          state_report{2, id, rank >= 0 ? 1u : 0u, rank, rank >= 0 ? int64_t{9} : -1}));
    }
    members.open_first_generation();
    members.next_generation();
    generations.take_over(1, first);
    generations.adopt(2, next, members.live_members(), 9, 5);
    members.place(generations.restore());
  }

  strategies::layout_plan first;
  job_params params;
  membership members;
  generation_plan generations;
};

// Who each rank sends its state to, as reconfigures found it before: a scan over every rank.
std::vector<int32_t> reference_send_to(const restore_plan& p, int32_t rank) {
  std::vector<int32_t> out;
  for (size_t r = 0; r < p.source_rank.size(); ++r)
    if (p.source[r] == state_source::peer && p.source_rank[r] == rank)
      out.push_back(static_cast<int32_t>(r));
  return out;
}

void expect_reconfigures_match(formed_job& job, const std::string& what) {
  actions out;
  job.generations.reconfigures(job.members, {3}, out);
  const auto sent = all_of<send_reconfigure>(out);
  ASSERT_EQ(static_cast<int>(sent.size()), job.members.live_count()) << what;
  const auto& restore = job.generations.restore();
  const std::string plan_json = strategies::to_json(job.generations.plan());
  for (const auto& s : sent) {
    EXPECT_EQ(s.member, s.msg.member) << what;
    EXPECT_EQ(s.msg.generation, 2u) << what;
    EXPECT_EQ(s.msg.plan_json, plan_json) << what;
    EXPECT_EQ(s.msg.skipped_steps, std::vector<int64_t>{3}) << what;
    if (s.msg.rank < 0) {
      EXPECT_EQ(s.msg.source, state_source::none) << what;
      EXPECT_TRUE(s.msg.send_to.empty()) << what;
      continue;
    }
    const auto r = static_cast<size_t>(s.msg.rank);
    EXPECT_EQ(restore.member_of_rank[r], s.member) << what;
    EXPECT_EQ(s.msg.source, restore.source[r]) << what;
    EXPECT_EQ(s.msg.source_rank, restore.source_rank[r]) << what;
    EXPECT_EQ(s.msg.send_to, reference_send_to(restore, s.msg.rank))
        << what << ", rank " << s.msg.rank;
  }
}

TEST(Reconfigures, SendListsMatchAScanOverEveryRank) {
  std::mt19937 rng(41);
  const auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  int peers_seen = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int tp = 1 + pick(2);
    const int first_dp = 1 + pick(6), next_dp = 1 + pick(8);
    const auto first = plan_for(first_dp, tp), next = plan_for(next_dp, tp);
    const int first_world = first.shape.world();
    const int count = next.shape.world() + pick(3);
    std::vector<int> held_rank(static_cast<size_t>(count), -1);
    for (int i = 0; i < count && i < first_world; ++i)
      held_rank[static_cast<size_t>(i)] = pick(5) == 0 ? -1 : i;
    std::shuffle(held_rank.begin(), held_rank.end(), rng);
    formed_job job(first, count);
    job.form(next, 1 + pick(4), [&](int32_t id) { return held_rank[static_cast<size_t>(id)]; });
    if (::testing::Test::HasFatalFailure()) return;
    expect_reconfigures_match(job, "trial " + std::to_string(trial));
    if (::testing::Test::HasFailure()) return;
    const auto& source = job.generations.restore().source;
    peers_seen += std::count(source.begin(), source.end(), state_source::peer) > 0;
  }
  EXPECT_GT(peers_seen, 50);  // enough generations with peers for the lists to be tested
}

// A grow to 100,000 ranks: half of them new, each sent its state by a peer.
TEST(Reconfigures, OneHundredThousandRanksInUnderTwoSeconds) {
  constexpr int big = 100'000, held = big / 2;
  const auto first = plan_for(held / 2, 2), next = plan_for(big / 2, 2);
  formed_job job(first, big);
  job.form(next, 8, [](int32_t id) { return id < held ? id : -1; });
  if (::testing::Test::HasFatalFailure()) return;
  actions out;
  const auto start = std::chrono::steady_clock::now();
  job.generations.reconfigures(job.members, {}, out);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "reconfigures, grow to " << big << " ranks: " << took << " s\n";
  EXPECT_LT(took, 2.0);
  const auto sent = all_of<send_reconfigure>(out);
  ASSERT_EQ(sent.size(), static_cast<size_t>(big));
  size_t sends = 0, plan_bytes = 0;
  for (const auto& s : sent) {
    sends += s.msg.send_to.size();
    plan_bytes = std::max(plan_bytes, s.msg.plan_json.size());
    if (s.msg.rank == 0 || s.msg.rank == 1) {
      ASSERT_EQ(s.msg.send_to.size(), static_cast<size_t>((big - held) / 2));
      EXPECT_EQ(s.msg.send_to.front(), held + s.msg.rank);
      EXPECT_TRUE(std::is_sorted(s.msg.send_to.begin(), s.msg.send_to.end()));
    } else {
      EXPECT_TRUE(s.msg.send_to.empty()) << s.msg.rank;
    }
  }
  EXPECT_EQ(sends, static_cast<size_t>(big - held));
  EXPECT_LT(plan_bytes, 4096u);
}

// ---- the plan's text -------------------------------------------------------------------------

// What to_json wrote before protocol 18: the counts listed one per replica.
std::string old_form(const strategies::layout_plan& p) {
  std::string text = strategies::to_json(p);
  const std::string runs_key = "\"replica_micro_batch_runs\":[";
  const auto from = text.find(runs_key);
  const auto to = text.find("]]", from);
  std::string counts;
  for (size_t i = 0; i < p.replica_micro_batches.size(); ++i)
    counts += (i ? "," : "") + std::to_string(p.replica_micro_batches[i]);
  text.replace(from, to + 2 - from, "\"replica_micro_batches\":[" + counts + "]");
  return text;
}

TEST(PlanJson, AnEvenTenThousandWayDpPlanIsSmall) {
  const auto plan = plan_for(10'000);
  ASSERT_EQ(plan.replica_micro_batches.size(), 10'000u);
  const auto text = strategies::to_json(plan);
  EXPECT_LT(text.size(), 4096u) << text.size();
  EXPECT_NE(text.find(R"("replica_micro_batch_runs":[[10000,1]])"), std::string::npos) << text;
  EXPECT_EQ(strategies::plan_from_json(text), plan);
  // The older per-replica form, twenty thousand bytes of it, reads back to the same plan.
  const auto old = old_form(plan);
  EXPECT_GT(old.size(), 20'000u);
  EXPECT_EQ(strategies::plan_from_json(old), plan);
}

TEST(PlanJson, UnevenCountsRoundTripInBothForms) {
  std::mt19937 rng(18);
  const auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  for (int trial = 0; trial < 500; ++trial) {
    auto plan = plan_for(1 + pick(40));
    // Counts in runs of random lengths, as a rebalance might choose them.
    plan.replica_micro_batches.clear();
    int distinct_runs = 0;
    while (plan.replica_micro_batches.size() < static_cast<size_t>(plan.shape.dp)) {
      const int count = 1 + pick(4);
      if (plan.replica_micro_batches.empty() || plan.replica_micro_batches.back() != count)
        ++distinct_runs;
      const size_t length = std::min<size_t>(1 + static_cast<size_t>(pick(6)),
                                             plan.shape.dp - plan.replica_micro_batches.size());
      plan.replica_micro_batches.insert(plan.replica_micro_batches.end(), length, count);
    }
    plan.micro_batches = 0;
    for (int c : plan.replica_micro_batches) plan.micro_batches += c;
    plan.micro_batches_per_replica =
        *std::max_element(plan.replica_micro_batches.begin(), plan.replica_micro_batches.end());
    const auto text = strategies::to_json(plan);
    EXPECT_EQ(strategies::plan_from_json(text), plan) << text;
    EXPECT_EQ(strategies::plan_from_json(old_form(plan)), plan) << old_form(plan);
    // One [replicas,count] pair per run of equal counts.
    const auto runs = nlohmann::json::parse(text)["replica_micro_batch_runs"];
    EXPECT_EQ(static_cast<int>(runs.size()), distinct_runs) << text;
  }
}

}  // namespace
}  // namespace troupe::actors
