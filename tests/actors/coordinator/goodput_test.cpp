// Goodput accounting (actors/coordinator/job/goodput.hpp): every rank-second in exactly one phase.

#include "actors/coordinator/job/goodput.hpp"

#include <gtest/gtest.h>

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

logic_time at(double s) {
  return logic_time{} +
         std::chrono::duration_cast<logic_clock::duration>(std::chrono::duration<double>(s));
}

void expect_whole(const goodput_ledger& l, double t) {
  EXPECT_NEAR(l.totals(at(t)).total(), l.wall_s(at(t)) * l.slots(), 1e-9) << "at t=" << t;
}

TEST(Goodput, SplitsAStepByWhatTheRanksMeasured) {
  goodput_ledger l(at(0), 2);
  expect_whole(l, 0.5);
  EXPECT_NEAR(l.totals(at(1))[phase::forming], 2.0, 1e-9);
  l.training(at(1), 2);
  // 1 s between commits, two ranks: 2 rank-seconds.
  const phase_seconds s = l.step_committed(at(2), 1, 2,
                                           {.compute_s = 1.0,
                                            .comm_s = 0.4,
                                            .optim_s = 0.2,
                                            .ckpt_stall_s = 0.1,
                                            .peer_wait_s = 0.1,
                                            .bubble_fraction = 0.25});
  EXPECT_NEAR(s[phase::compute], 0.75 + 0.2, 1e-9);
  EXPECT_NEAR(s[phase::bubble], 0.25, 1e-9);
  EXPECT_NEAR(s[phase::exposed_comm], 0.4, 1e-9);
  EXPECT_NEAR(s[phase::straggler_wait], 0.1, 1e-9);
  EXPECT_NEAR(s[phase::checkpoint_stall], 0.1, 1e-9);
  EXPECT_NEAR(s[phase::control], 2.0 - 1.8, 1e-9);
  EXPECT_NEAR(s.total(), 2.0, 1e-9);
  expect_whole(l, 2);
  EXPECT_NEAR(l.goodput(at(2)), 0.95 / 4.0, 1e-9);
}

TEST(Goodput, AReductionWaitingForTheSlowestRankIsStragglerWait) {
  goodput_ledger l(at(0), 2);
  l.training(at(0), 2);
  // Rank 1 computes 0.8 s, rank 0 0.2 s and then waits 0.6 s inside the reduction.
  const phase_seconds s = l.step_committed(
      at(1), 1, 2, {.compute_s = 1.0, .comm_s = 0.9, .collective_skew_s = 2 * 0.8 - 1.0});
  EXPECT_NEAR(s[phase::straggler_wait], 0.6, 1e-9);
  EXPECT_NEAR(s[phase::exposed_comm], 0.3, 1e-9);
  EXPECT_NEAR(s.total(), 2.0, 1e-9);
}

TEST(Goodput, MeasuresBeyondTheIntervalAreScaledToFit) {
  goodput_ledger l(at(0), 1);
  l.training(at(0), 1);
  const phase_seconds s = l.step_committed(at(1), 1, 1, {.compute_s = 1.5, .comm_s = 0.5});
  EXPECT_NEAR(s.total(), 1.0, 1e-9);
  EXPECT_NEAR(s[phase::compute], 0.75, 1e-9);
  EXPECT_NEAR(s[phase::control], 0.0, 1e-9);
}

TEST(Goodput, RecoveryRunsFromTheFailureToTheNewGenerationsFirstCommit) {
  goodput_ledger l(at(0), 4);
  l.training(at(0), 4);
  (void)l.step_committed(at(1), 1, 4, {.compute_s = 4});
  l.recovering(at(1.5));  // the step in flight is lost with the failure
  EXPECT_NEAR(l.totals(at(1.5))[phase::recovery], 2.0, 1e-9);
  l.training(at(3), 3);  // one rank fewer
  EXPECT_NEAR(l.totals(at(3))[phase::recovery], 2.0 + 1.5 * 4, 1e-9);
  const phase_seconds first = l.step_committed(at(3.5), 2, 3, {.compute_s = 1.5});
  EXPECT_NEAR(first[phase::recovery], 0.5 * 4, 1e-9);
  EXPECT_NEAR(first[phase::compute], 0, 1e-9);
  const phase_seconds next = l.step_committed(at(4.5), 3, 3, {.compute_s = 3});
  EXPECT_NEAR(next[phase::compute], 3, 1e-9);
  EXPECT_NEAR(next[phase::idle], 1, 1e-9) << "the lost rank's slot waits for a replacement";
  expect_whole(l, 4.5);
  expect_whole(l, 5);
}

TEST(Goodput, AStepCommittedAgainIsRedone) {
  goodput_ledger l(at(0), 2);
  l.training(at(0), 2);
  (void)l.step_committed(at(1), 1, 2, {.compute_s = 2});
  (void)l.step_committed(at(2), 2, 2, {.compute_s = 2});
  const phase_seconds again = l.step_committed(at(3), 2, 2, {.compute_s = 2});
  EXPECT_NEAR(again[phase::redone], 2, 1e-9);
  EXPECT_NEAR(again[phase::compute], 0, 1e-9);
  EXPECT_NEAR(l.totals(at(3))[phase::compute], 4, 1e-9);
}

TEST(Goodput, TheEndBooksTheTailAndStopsTheClock) {
  goodput_ledger l(at(0), 2);
  l.training(at(0), 2);
  (void)l.step_committed(at(1), 1, 2, {.compute_s = 2});
  l.ended(at(1.5), phase::checkpoint_stall);
  EXPECT_NEAR(l.totals(at(9))[phase::checkpoint_stall], 1.0, 1e-9);
  EXPECT_NEAR(l.wall_s(at(9)), 1.5, 1e-9);
  expect_whole(l, 9);
}

TEST(Goodput, EveryPhaseHasAName) {
  for (int p = 0; p < phase_count; ++p) EXPECT_FALSE(phase_name(static_cast<phase>(p)).empty());
  EXPECT_EQ(phase_name(phase::exposed_comm), "exposed_comm");
  EXPECT_EQ(phase_name(phase::straggler_wait), "straggler_wait");
}

}  // namespace
}  // namespace troupe::actors
