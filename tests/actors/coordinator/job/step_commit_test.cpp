// The votes of a step and what a commit leaves behind (actors/coordinator/job/step_commit.hpp):
// votes summed, divergence seen in a vote, a failed vote's settle window and culprits, validation.

#include "actors/coordinator/job/step_commit.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "runtime/comm/communicator.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

const logic_time t0 = logic_time{} + 1000s;

job_params params() {
  job_params p;
  p.start_step = 4;
  p.settle = 500ms;
  return p;
}

step_done vote(int32_t rank, int64_t step, double loss_sum = 3.0) {
  step_done v;
  v.generation = 1;
  v.step = step;
  v.rank = rank;
  v.loss_sum = loss_sum;
  v.tokens = 2;
  v.compute_s = 0.1 * (rank + 1);
  return v;
}

step_done failed_vote(int32_t rank, comm::comm_errc kind) {
  step_done v = vote(rank, 5);
  v.ok = false;
  v.error = "boom";
  v.error_op = "all_reduce";
  v.error_kind = static_cast<int32_t>(kind);
  return v;
}

TEST(StepCommit, SumsTheVotesOfAStepAndCommitsThem) {
  step_commit s(params(), t0);
  EXPECT_EQ(s.committed(), 4);
  actions out;
  s.count(vote(0, 5), 2, 1, t0 + 1s, out);
  EXPECT_FALSE(s.all_in(2));
  s.count(vote(1, 5, 5.0), 2, 1, t0 + 2s, out);
  EXPECT_TRUE(s.all_in(2));
  EXPECT_TRUE(out.empty());  // no memory figures in these votes
  const step_votes v = s.take();
  EXPECT_EQ(v.step, 5);
  EXPECT_EQ(v.tokens, 4);
  EXPECT_DOUBLE_EQ(v.mean_loss(), 2.0);
  EXPECT_TRUE(v.diverged.empty());
  EXPECT_DOUBLE_EQ(v.rank_compute_s[1], 0.2);
  EXPECT_FALSE(s.all_in(2));  // the next step's votes start empty
  EXPECT_DOUBLE_EQ(s.commit(v, v.mean_loss(), t0 + 3s), 3.0);
  EXPECT_EQ(s.committed(), 5);
  EXPECT_EQ(s.tokens_trained(), 4);
}

TEST(StepCommit, AVoteThatShowsDivergenceSaysWhereFirst) {
  step_commit s(params(), t0);
  actions out;
  s.count(vote(0, 5, -1.0), 2, 1, t0, out);
  step_done nan = vote(1, 5);
  nan.loss_sum = std::numeric_limits<double>::quiet_NaN();
  nan.loss_class = wire_encode(nan.loss_sum);
  s.count(nan, 2, 1, t0, out);
  EXPECT_EQ(s.take().diverged, "loss -0.5 on rank 0 (a cross-entropy below zero)");
}

TEST(StepCommit, LogsTheMemoryARankReports) {
  step_commit s(params(), t0);
  actions out;
  step_done v = vote(0, 5);
  v.optim_state_bytes = 1024;
  s.count(v, 1, 3, t0, out);
  ASSERT_EQ(out.size(), 1u);
  const auto& event = std::get<emit_event>(out[0]).event;
  EXPECT_EQ(events::kind(event), "memory");
  const auto& e = std::get<events::memory>(event);
  EXPECT_EQ(e.generation, 3u);
  EXPECT_EQ(e.optimizer_state_bytes, 1024);
}

// Up to metrics_rank_labels ranks a memory event each; above, one memory_summary once the
// step's votes are all in, with the spread of each figure over the ranks.
TEST(StepCommit, AboveTheRankLabelsTheMemoryOfAllRanksIsOneSummary) {
  job_params p = params();
  p.cfg.metrics_rank_labels = 2;
  const auto memory_vote = [](int32_t rank, int64_t step, int64_t optimizer, int64_t rss) {
    step_done v = vote(rank, step);
    v.optim_state_bytes = optimizer;
    v.peak_rss_bytes = rss;
    return v;
  };
  {  // 2 ranks: at the threshold, each rank its line
    step_commit s(p, t0);
    actions out;
    s.count(memory_vote(0, 5, 10, 1), 2, 1, t0, out);
    s.count(memory_vote(1, 5, 20, 2), 2, 1, t0, out);
    ASSERT_EQ(out.size(), 2u);
    for (const auto& a : out) EXPECT_EQ(events::kind(std::get<emit_event>(a).event), "memory");
  }
  step_commit s(p, t0);
  actions out;
  const int world = 4;
  s.count(memory_vote(2, 5, 300, 30), world, 3, t0, out);
  s.count(memory_vote(0, 5, 100, 50), world, 3, t0, out);
  s.count(vote(3, 5), world, 3, t0, out);  // a rank without figures (none to report)
  EXPECT_TRUE(out.empty());
  s.count(memory_vote(1, 5, 200, 40), world, 3, t0, out);
  ASSERT_EQ(out.size(), 1u);
  const auto& e = std::get<events::memory_summary>(std::get<emit_event>(out[0]).event);
  EXPECT_EQ(e.step, 5);
  EXPECT_EQ(e.generation, 3u);
  EXPECT_EQ(e.ranks, 3);
  EXPECT_EQ(e.optimizer_state_bytes, (events::spread<int64_t>{100, 200, 300}));
  EXPECT_EQ(e.peak_rss_bytes, (events::spread<int64_t>{30, 40, 50}));

  // The next step's votes carry no figures: nothing more is logged.
  out.clear();
  s.take();
  for (int32_t r = 0; r < world; ++r) s.count(vote(r, 6), world, 3, t0, out);
  EXPECT_TRUE(out.empty());
}

TEST(FailedVotes, WaitTheSettleWindowForTheirRootCause) {
  step_commit s(params(), t0);
  s.fail(failed_vote(1, comm::comm_errc::peer_lost), t0);
  s.fail(failed_vote(0, comm::comm_errc::peer_lost), t0 + 100ms);
  EXPECT_EQ(s.failure(), "rank 1 failed step 5 (all_reduce): boom");
  EXPECT_FALSE(s.failure_settled(t0 + 499ms));
  EXPECT_TRUE(s.failure_settled(t0 + 500ms));
  // A lost peer is nobody's fault among the voters.
  EXPECT_TRUE(s.culprits(3).empty());
  s.new_generation();
  EXPECT_FALSE(s.failure_settled(t0 + 1s));
}

TEST(FailedVotes, ARankWhoseOwnCollectiveFailedIsTheCulprit) {
  step_commit s(params(), t0);
  s.fail(failed_vote(0, comm::comm_errc::peer_lost), t0);
  s.fail(failed_vote(2, comm::comm_errc::internal), t0);
  s.fail(failed_vote(1, comm::comm_errc::timeout), t0);
  EXPECT_EQ(s.culprits(4), std::vector<int32_t>{2});
}

TEST(FailedVotes, WhenACollectiveTimedOutTheRanksThatSaidNothingHang) {
  step_commit s(params(), t0);
  s.fail(failed_vote(0, comm::comm_errc::timeout), t0);
  s.fail(failed_vote(2, comm::comm_errc::peer_lost), t0);
  EXPECT_EQ(s.culprits(4), (std::vector<int32_t>{1, 3}));
}

TEST(Validation, SumsEveryRanksReportIntoOneLoss) {
  step_commit s(params(), t0);
  EXPECT_FALSE(s.awaits_validation(5));
  s.expect_validation(5);
  EXPECT_TRUE(s.awaits_validation(5));
  EXPECT_FALSE(s.awaits_validation(4));
  actions out;
  eval_done e;
  e.step = 5;
  e.loss_sum = 6.0;
  e.batches = 2;
  EXPECT_FALSE(s.add_validation(e, 2, 1, out));
  e.loss_sum = 2.0;
  EXPECT_TRUE(s.add_validation(e, 2, 1, out));
  EXPECT_DOUBLE_EQ(s.last_val_loss(), 2.0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(events::kind(std::get<emit_event>(out[0]).event), "validation");
  EXPECT_FALSE(s.validating());
}

}  // namespace
}  // namespace troupe::actors
