// Divergence (actors/coordinator/job/divergence.hpp): which votes and losses show it, and the
// policy that stops the job or rolls it back and skips the batch.

#include "actors/coordinator/job/divergence.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace troupe::actors {
namespace {

constexpr double inf = std::numeric_limits<double>::infinity();
const double nan = std::nan("");

job_params params(const std::string& policy, int max_rollbacks, std::vector<int64_t> skipped = {}) {
  job_params p;
  p.cfg.on_divergence = policy;
  p.cfg.max_rollbacks = max_rollbacks;
  p.skipped_steps = std::move(skipped);
  return p;
}

TEST(DivergenceSigns, ANegativeOrInfiniteLossOrNormNeverPasses) {
  EXPECT_EQ(vote_divergence(0, 3.0, 2, 1.0), "");
  EXPECT_EQ(vote_divergence(1, nan, 2, 1.0), "loss nan on rank 1 (not finite)");
  EXPECT_EQ(vote_divergence(1, -inf, 0, 1.0), "loss -inf on rank 1 (not finite)");
  EXPECT_EQ(vote_divergence(2, -1.0, 4, 1.0), "loss -0.25 on rank 2 (a cross-entropy below zero)");
  EXPECT_EQ(vote_divergence(3, 1.0, 4, inf), "gradient norm inf on rank 3 (not finite)");
  EXPECT_EQ(loss_divergence(2.5), "");
  EXPECT_EQ(loss_divergence(nan), "loss nan (not finite)");
  EXPECT_EQ(loss_divergence(-0.5), "loss -0.5 (a cross-entropy below zero)");
}

TEST(Divergence, StopsWhenThePolicySaysStop) {
  divergence d(params("stop", 3));
  actions out;
  EXPECT_FALSE(d.decide(7, "loss nan", 2, 6, out));
  ASSERT_EQ(out.size(), 1u);  // no record_skipped
  const auto& event = std::get<emit_event>(out[0]).event;
  EXPECT_EQ(events::kind(event), "diverged");
  const auto& e = std::get<events::diverged>(event);
  EXPECT_EQ(e.action, "stop");
  EXPECT_EQ(e.committed_step, 6);
  EXPECT_TRUE(d.skipped().empty());
  EXPECT_NE(d.stop_words(7, "loss nan", "no checkpoint was committed")
                .find("lower --lr, or pass --on-divergence rollback"),
            std::string::npos);
}

TEST(Divergence, RollsBackUntilTheRollbacksAreSpentAndSkipsEachBatch) {
  divergence d(params("rollback", 2, {9, 3}));
  EXPECT_EQ(d.skipped(), (std::vector<int64_t>{3, 9}));  // earlier sessions', sorted
  actions out;
  EXPECT_TRUE(d.decide(7, "loss nan", 1, 6, out));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(std::get<record_skipped>(out[0]).steps, (std::vector<int64_t>{3, 7, 9}));
  EXPECT_TRUE(d.decide(7, "loss nan", 2, 6, out));  // the replay met another bad batch
  EXPECT_EQ(d.skipped(), (std::vector<int64_t>{3, 7, 7, 9}));
  EXPECT_FALSE(d.decide(8, "loss nan", 3, 7, out));
  EXPECT_EQ(d.rollbacks(), 2);
  EXPECT_NE(d.stop_words(8, "loss nan", "x").find("2 rollbacks spent (--max-rollbacks 2)"),
            std::string::npos);
  EXPECT_EQ(d.rollback_words(7, "loss nan", 5),
            "step 7 diverged (loss nan); rolling back to checkpoint step 5 and skipping the batch "
            "of step 7 (rollback 2 of 2)");
}

TEST(Divergence, AnArmedRollbackIsTakenOnce) {
  divergence d(params("rollback", 1));
  EXPECT_FALSE(d.rollback_armed());
  d.arm_rollback();
  EXPECT_TRUE(d.rollback_armed());
  EXPECT_TRUE(d.take_rollback());
  EXPECT_FALSE(d.take_rollback());
}

}  // namespace
}  // namespace troupe::actors
