// The job's parameters derived from the validated config (actors/coordinator/job/job_params.hpp):
// each setting of the config reaches the logic through make_job_params alone, so a setting given on
// the command line is the one the logic uses.

#include "actors/coordinator/job/job_params.hpp"

#include <gtest/gtest.h>

#include <chrono>

#include "actors/coordinator/straggler_detector.hpp"
#include "strategies/planner.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

train_config small_config() {
  train_config c;
  c.world = 4;
  c.batch = 8;
  c.micro_batch = 2;
  return c;
}

strategies::layout_plan plan_for(const train_config& c) {
  return strategies::plan_of(strategies::plan_layout(c.world, c));
}

TEST(JobParamsTest, EveryElasticSettingComesFromTheConfig) {
  train_config c = small_config();
  c.elastic.nodes = 2;
  c.elastic.spares = 1;
  c.elastic.min_ranks = 2;
  c.elastic.max_ranks = 6;
  c.elastic.heartbeat_timeout_ms = 3500;
  c.elastic.replacement_wait_ms = 750;
  c.elastic.max_restarts = 4;
  c.elastic.straggler_policy = "evict";
  c.elastic.straggler_factor = 1.8;
  const auto plan = plan_for(c);
  const job_params p = make_job_params(c, plan, 0, {});
  EXPECT_EQ(p.members, 5) << "the plan's world and the spares";
  EXPECT_EQ(p.nodes, 2);
  EXPECT_EQ(p.bounds.min_ranks, 2);
  EXPECT_EQ(p.bounds.max_ranks, 6);
  EXPECT_EQ(p.heartbeat_timeout, 3500ms);
  EXPECT_EQ(p.replacement_wait, 750ms);
  EXPECT_EQ(p.max_restarts, 4);
  EXPECT_EQ(p.straggler_policy, "evict");
  EXPECT_EQ(p.straggler_factor, 1.8);
  EXPECT_EQ(p.plan, plan);
  EXPECT_EQ(p.cfg.elastic.heartbeat_timeout_ms, 3500) << "the config travels whole";
  EXPECT_EQ(p.coordinator_timeout, 17500ms) << "5 x the heartbeat timeout when not set";
  EXPECT_EQ(p.stall_gap, 1750ms) << "half the heartbeat timeout";
  c.elastic.coordinator_timeout_ms = 9000;
  c.elastic.join_timeout_ms = 12000;
  const job_params q = make_job_params(c, plan, 0, {});
  EXPECT_EQ(q.coordinator_timeout, 9000ms);
  EXPECT_EQ(q.form_timeout, 12000ms);
}

TEST(JobParamsTest, NoMaxRanksBoundsTheWorldAtItsConfiguredSize) {
  const train_config c = small_config();
  const job_params p = make_job_params(c, plan_for(c), 0, {});
  EXPECT_EQ(p.bounds.max_ranks, 4);
  EXPECT_EQ(p.bounds.min_ranks, 1);
  EXPECT_EQ(p.members, 4);
  EXPECT_EQ(p.nodes, 1);
}

TEST(JobParamsTest, AFreshJobHasNoCheckpointAResumedOneStartsFromIt) {
  const train_config c = small_config();
  const job_params fresh = make_job_params(c, plan_for(c), 0, {});
  EXPECT_EQ(fresh.start_step, 0);
  EXPECT_EQ(fresh.checkpoint_step, -1);
  EXPECT_TRUE(fresh.skipped_steps.empty());
  const job_params resumed = make_job_params(c, plan_for(c), 40, {7, 12});
  EXPECT_EQ(resumed.start_step, 40);
  EXPECT_EQ(resumed.checkpoint_step, 40);
  EXPECT_EQ(resumed.skipped_steps, (std::vector<int64_t>{7, 12}));
}

TEST(JobParamsTest, TheDefaultsOfTheConfigAreTheDefaultsOfTheLogic) {
  // A job_params built by hand (the logic's tests) and one derived from a default config agree
  // on every timeout and policy, so neither default can drift from the other unnoticed.
  const train_config c = small_config();
  const job_params derived = make_job_params(c, plan_for(c), 0, {});
  const job_params by_hand;
  EXPECT_EQ(derived.heartbeat_timeout, by_hand.heartbeat_timeout);
  EXPECT_EQ(derived.straggler_policy, by_hand.straggler_policy);
  EXPECT_EQ(derived.straggler_factor, by_hand.straggler_factor);
  EXPECT_EQ(derived.straggler_factor, straggler_options{}.factor);
  EXPECT_EQ(derived.form_timeout, by_hand.form_timeout);
  EXPECT_EQ(derived.coordinator_timeout, by_hand.coordinator_timeout);
}

}  // namespace
}  // namespace troupe::actors
