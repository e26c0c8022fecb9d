// Re-planning for a changed world, the plan's JSON round trip, and straggler rebalancing:
// pure functions of strategies/replan.hpp.

#include "strategies/replan.hpp"

#include <gtest/gtest.h>

namespace troupe::strategies {
namespace {

train_config small(int world) {
  train_config cfg;
  cfg.world = world;
  cfg.batch = 8;
  cfg.micro_batch = 2;
  cfg.model.n_layer = 2;
  cfg.model.n_head = 2;
  cfg.model.d_model = 32;
  cfg.model.context = 32;
  return cfg;
}

TEST(ReplanTest, ShrinksDataParallelUnevenlyAndKeepsTheBatch) {
  auto cfg = small(4);
  auto first = plan_of(plan_layout(4, cfg));
  auto next = replan_layout(first, 3, cfg.model, constraints_from(cfg), {1, 4});
  ASSERT_TRUE(has_plan(next)) << reason_of(next);
  EXPECT_EQ(plan_of(next).shape.dp, 3);
  EXPECT_EQ(plan_of(next).replica_micro_batches, (std::vector<int>{2, 1, 1}));
  EXPECT_EQ(plan_of(next).spares, 0);
}

TEST(ReplanTest, KeepsPipelineStagesAndLeavesSpares) {
  auto cfg = small(4);
  cfg.parallel.pp = 2;
  cfg.parallel.micro_batches = 4;
  auto first = plan_of(plan_layout(4, cfg));
  auto next = replan_layout(first, 3, cfg.model, constraints_from(cfg), {1, 4});
  ASSERT_TRUE(has_plan(next));
  EXPECT_EQ(plan_of(next).shape.pp, 2);
  EXPECT_EQ(plan_of(next).shape.dp, 1);
  EXPECT_EQ(plan_of(next).spares, 1);
  // One rank cannot hold two stages: pp is planned again.
  auto one = replan_layout(first, 1, cfg.model, constraints_from(cfg), {1, 4});
  ASSERT_TRUE(has_plan(one)) << reason_of(one);
  EXPECT_EQ(plan_of(one).shape.world(), 1);
}

TEST(ReplanTest, HonoursMinAndMaxRanks) {
  auto cfg = small(4);
  auto first = plan_of(plan_layout(4, cfg));
  EXPECT_FALSE(has_plan(replan_layout(first, 1, cfg.model, constraints_from(cfg), {2, 4})));
  auto capped = replan_layout(first, 6, cfg.model, constraints_from(cfg), {1, 4});
  ASSERT_TRUE(has_plan(capped));
  EXPECT_EQ(plan_of(capped).shape.world(), 4);
  EXPECT_EQ(plan_of(capped).spares, 2);
  for (int live = 0; live <= 70; ++live)
    (void)replan_layout(first, live, cfg.model, constraints_from(cfg), {1, 0});
}

TEST(ReplanTest, PlanTravelsAsJson) {
  auto cfg = small(4);
  auto p = plan_of(
      replan_layout(plan_of(plan_layout(4, cfg)), 3, cfg.model, constraints_from(cfg), {1, 4}));
  auto back = plan_from_json(to_json(p));
  EXPECT_EQ(back.shape, p.shape);
  EXPECT_EQ(back.replica_micro_batches, p.replica_micro_batches);
  EXPECT_EQ(back.micro_batch_size, p.micro_batch_size);
  EXPECT_EQ(back.stages, p.stages);
  EXPECT_THROW(plan_from_json("{}"), std::invalid_argument);
  EXPECT_THROW(plan_from_json("not json"), std::invalid_argument);
  std::string wrong_sum = to_json(p);
  const std::string counts = "[[1,2],[2,1]]";  // 2, 1, 1 as runs
  wrong_sum.replace(wrong_sum.find(counts), counts.size(), "[[1,2],[2,2]]");
  EXPECT_THROW(plan_from_json(wrong_sum), std::invalid_argument);
}

TEST(ReplanTest, BalancesMicroBatchesBySpeed) {
  EXPECT_EQ(balance_micro_batches(8, {1, 1}, 1), (std::vector<int>{4, 4}));
  EXPECT_EQ(balance_micro_batches(9, {1, 0.5}, 1), (std::vector<int>{6, 3}));
  EXPECT_EQ(balance_micro_batches(4, {1, 0.01}, 2), (std::vector<int>{2, 2}));
  EXPECT_TRUE(balance_micro_batches(3, {1, 1}, 2).empty());
  EXPECT_TRUE(balance_micro_batches(4, {1, -1}, 1).empty());
  EXPECT_TRUE(balance_micro_batches(4, {}, 1).empty());
}

}  // namespace
}  // namespace troupe::strategies
