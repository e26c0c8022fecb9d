// The fault schedule (chaos/schedule.hpp): which fault is due at which step for whom, what the
// coordinator does for it, and what a rank injects into its own step.

#include "chaos/schedule.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

namespace troupe::chaos {
namespace {

using std::chrono::milliseconds;
using action = fault_firing::action;

fault_schedule schedule_of(const std::vector<std::string>& specs) {
  return fault_schedule(parse_faults(specs, fault_bounds{.world = 4, .nodes = 2, .steps = 100}));
}

std::vector<std::string> specs_of(const std::vector<fault_firing>& due) {
  std::vector<std::string> out;
  for (const auto& x : due) out.push_back(x.fault.spec);
  return out;
}

TEST(FaultScheduleTest, FiresEachFaultOnceWhenItsStepBegins) {
  auto s = schedule_of({"kill:rank=1:step=8", "stop:rank=2:step=3", "kill:node=1:step=8"});
  EXPECT_TRUE(s.take_due(2).empty());
  EXPECT_EQ(specs_of(s.take_due(3)), std::vector<std::string>{"stop:rank=2:step=3"});
  EXPECT_TRUE(s.take_due(3).empty()) << "a fault fires once, however often its step begins";
  EXPECT_TRUE(s.take_due(7).empty());
  // Faults of one step keep the order they were given in.
  EXPECT_EQ(specs_of(s.take_due(8)),
            (std::vector<std::string>{"kill:rank=1:step=8", "kill:node=1:step=8"}));
  EXPECT_EQ(s.pending(), 0u);
}

TEST(FaultScheduleTest, ASkippedStepFiresEveryFaultItPassed) {
  // The coordinator asks as each step begins; one that resumes past a fault's step (a resume,
  // or steps committed while it was busy) still fires it, late rather than never.
  auto s = schedule_of({"kill:rank=1:step=4", "kill:rank=2:step=6", "kill:rank=3:step=9"});
  EXPECT_EQ(specs_of(s.take_due(7)),
            (std::vector<std::string>{"kill:rank=1:step=4", "kill:rank=2:step=6"}));
  EXPECT_EQ(s.pending(), 1u);
}

TEST(FaultScheduleTest, SaysWhatTheCoordinatorDoes) {
  auto s = schedule_of({"kill:rank=1:step=2", "kill:node=0:step=2", "stop:rank=2:step=2:for=3s",
                        "stop:rank=3:step=2", "diverge:step=2:rank=1", "kill:coordinator:step=2"});
  const auto due = s.take_due(2);
  ASSERT_EQ(due.size(), 6u);
  EXPECT_EQ(due[0].what, action::signal_victims);
  EXPECT_EQ(due[0].signal, SIGKILL);
  EXPECT_EQ(due[1].what, action::signal_victims);
  EXPECT_EQ(due[1].signal, SIGKILL);
  EXPECT_EQ(due[1].fault.target, fault_target::node);
  EXPECT_EQ(due[2].what, action::signal_victims);
  EXPECT_EQ(due[2].signal, SIGSTOP);
  EXPECT_EQ(due[2].continue_after, milliseconds(3000));
  EXPECT_EQ(due[3].signal, SIGSTOP);
  EXPECT_EQ(due[3].continue_after, milliseconds(0)) << "never continued";
  EXPECT_EQ(due[4].what, action::announce) << "the rank poisons its own loss";
  EXPECT_EQ(due[4].signal, 0);
  EXPECT_EQ(due[5].what, action::kill_coordinator);
  EXPECT_EQ(due[5].signal, SIGKILL);
}

TEST(FaultScheduleTest, TheCoordinatorNeverFiresASlowFault) {
  auto s = schedule_of({"slow:rank=1:factor=3:from=2", "kill:rank=0:step=5"});
  EXPECT_TRUE(s.take_due(2).empty()) << "the rank slows itself down";
  EXPECT_EQ(specs_of(s.take_due(5)), std::vector<std::string>{"kill:rank=0:step=5"});
}

TEST(FaultScheduleTest, RandomSchedulesFireTheirKills) {
  auto s = schedule_of({"random:kills=3:seed=7:from=5:every=5"});
  ASSERT_EQ(s.pending(), 3u);
  const auto due = s.take_due(100);
  ASSERT_EQ(due.size(), 3u);
  for (const auto& x : due) {
    EXPECT_EQ(x.what, action::signal_victims);
    EXPECT_EQ(x.signal, SIGKILL);
    EXPECT_GE(x.fault.step, 5);
  }
}

TEST(FaultScheduleTest, ARankSlowsItselfFromTheFirstSlowedStepOn) {
  const auto s = schedule_of({"slow:rank=1:factor=3:from=4", "slow:rank=1:factor=5:from=6"});
  EXPECT_EQ(s.on_step_begin(1, 3, 2), step_injection{});
  EXPECT_EQ(s.on_step_begin(1, 4, 3).slowdown, 3.0);
  EXPECT_EQ(s.on_step_begin(1, 7, 6).slowdown, 5.0) << "the largest factor that has begun";
  EXPECT_EQ(s.on_step_begin(0, 7, 6).slowdown, 1.0) << "other ranks are not slowed";
}

TEST(FaultScheduleTest, ARankDivergesOnceOnItsOwnBatch) {
  const auto s = schedule_of({"diverge:step=5:rank=2"});
  EXPECT_TRUE(s.on_step_begin(2, 5, 4).diverge);
  EXPECT_FALSE(s.on_step_begin(1, 5, 4).diverge) << "another rank";
  EXPECT_FALSE(s.on_step_begin(2, 6, 5).diverge) << "another step";
  // The replay after a rollback that skipped the batch trains step 5 on position 5.
  EXPECT_FALSE(s.on_step_begin(2, 5, 5).diverge);
}

TEST(FaultScheduleTest, ALaterFaultPoisonsItsBatchAfterAnEarlierSkip) {
  // Two poisoned batches: after the first (step 5's) was skipped, step 8 of a run that skipped
  // nothing trains on position 7 at step 7, so the second fires there, once.
  const auto s = schedule_of({"diverge:step=5", "diverge:step=8"});
  EXPECT_TRUE(s.on_step_begin(0, 7, 7).diverge);
  EXPECT_FALSE(s.on_step_begin(0, 8, 8).diverge) << "step 8 now trains on the batch after";
  EXPECT_FALSE(s.on_step_begin(0, 7, 8).diverge) << "the replay after the second skip";
}

TEST(FaultScheduleTest, AnEmptyScheduleDoesNothing) {
  fault_schedule s;
  EXPECT_EQ(s.on_step_begin(0, 1, 0), step_injection{});
  EXPECT_TRUE(s.take_due(1000).empty());
}

}  // namespace
}  // namespace troupe::chaos
