// Who fills a lost member's place (actors/coordinator/job/replacements.hpp): waiting for workers
// agents restart, and growing onto idle members.

#include "actors/coordinator/job/replacements.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

const logic_time t0 = logic_time{} + 1000s;

job_params params(int max_restarts, std::chrono::milliseconds wait) {
  job_params p;
  p.cfg.world = 4;
  p.cfg.steps = 100;
  p.cfg.batch = 8;
  p.cfg.micro_batch = 2;
  p.cfg.model.n_layer = 2;
  p.cfg.model.n_head = 2;
  p.cfg.model.d_model = 32;
  p.cfg.model.context = 32;
  p.plan = strategies::plan_of(strategies::plan_layout(4, p.cfg));
  p.bounds.min_ranks = 1;
  p.bounds.max_ranks = 4;
  p.max_restarts = max_restarts;
  p.replacement_wait = wait;
  return p;
}

TEST(Replacements, ACrashWithRestartsLeftIsWaitedForUntilTheDeadline) {
  const auto p = params(1, 3000ms);
  replacements r(p);
  r.member_lost(0, loss_cause::exit, t0);
  EXPECT_EQ(r.awaited(), 1);
  EXPECT_EQ(r.deadline(), t0 + 3000ms);
  // Three live members: the restarted one makes the layout whole again.
  EXPECT_TRUE(r.worth_waiting(p.plan, 3, t0 + 1s));
  EXPECT_FALSE(r.worth_waiting(p.plan, 3, t0 + 3s));  // too late
  // An idle spare already fills the place: waiting adds no rank.
  EXPECT_FALSE(r.worth_waiting(p.plan, 4, t0 + 1s));
  actions out;
  r.hold(2, t0 + 1s, out);
  r.hold(2, t0 + 2s, out);
  ASSERT_EQ(out.size(), 1u);  // said once
  const auto& event = std::get<emit_event>(out[0]).event;
  EXPECT_EQ(events::kind(event), "replacement_wait");
  EXPECT_EQ(std::get<events::replacement_wait>(event).wait_ms, 2000);
  EXPECT_TRUE(r.held());
  r.rejoined(0);
  EXPECT_EQ(r.awaited(), 0);
  r.planned();
  EXPECT_FALSE(r.held());
}

TEST(Replacements, OnlyACrashWhoseAgentLivesAndHasRestartsLeftComesBack) {
  const auto p = params(1, 3000ms);
  replacements r(p);
  r.member_lost(0, loss_cause::hang, t0);  // a hung worker is not restarted by its agent
  EXPECT_EQ(r.awaited(), 0);
  r.member_lost(0, loss_cause::connection, t0);
  EXPECT_EQ(r.awaited(), 1);
  r.member_lost(0, loss_cause::exit, t0);  // the node's budget (1) is spent
  EXPECT_EQ(r.awaited(), 1);
  r.agent_lost(1);
  r.member_lost(1, loss_cause::exit, t0);  // its agent is gone
  EXPECT_EQ(r.awaited(), 1);
  r.agent_lost(0);  // and the one awaited never comes
  EXPECT_EQ(r.awaited(), 0);
}

TEST(Replacements, NoWaitWithoutAReplacementWait) {
  replacements r(params(3, 0ms));
  r.member_lost(0, loss_cause::exit, t0);
  EXPECT_EQ(r.awaited(), 0);
}

TEST(Replacements, IdleMembersGrowTheLayoutOnlyWhenAPlanUsesThem) {
  const auto p = params(0, 0ms);
  replacements r(p);
  auto three = strategies::plan_of(strategies::replan_layout(
      p.plan, 3, p.cfg.model, strategies::constraints_from(p.cfg), p.bounds));
  ASSERT_EQ(three.shape.world(), 3);
  EXPECT_TRUE(r.grow_wanted(three, 4, 1));
  EXPECT_FALSE(r.grow_wanted(three, 3, 0));
  EXPECT_FALSE(r.grow_wanted(p.plan, 5, 1));  // max_ranks 4: a fifth member stays a spare
}

}  // namespace
}  // namespace troupe::actors
