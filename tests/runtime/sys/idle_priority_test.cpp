// The idle lane: background work runs under SCHED_IDLE, and a job that someone waits for, or
// that has run past its deadline, moves back to the normal scheduler so that it cannot starve.

#include "runtime/sys/idle_priority.hpp"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tests/runtime/sys/eventually.hpp"

namespace troupe::sys {
namespace {

using testing::eventually;

using namespace std::chrono_literals;

int policy_of(pid_t tid) { return ::sched_getscheduler(tid); }

// A worker thread driven step by step from the test.
struct worker {
  idle_lane& lane;
  std::atomic<pid_t> tid{0};
  std::atomic<int> go{0};  // 1: start a job, 2: finish it, 3: quit
  std::atomic<int> state{0};
  std::thread thread;
  explicit worker(idle_lane& l) : lane(l) {
    thread = std::thread([this] {
      lane.join();
      tid = ::gettid();
      for (;;) {
        while (go.load() == state.load()) std::this_thread::sleep_for(1ms);
        const int next = go.load();
        if (next == 1) lane.job_started();
        if (next == 2) lane.job_finished();
        state = next;
        if (next == 3) return;
      }
    });
    EXPECT_TRUE(eventually([&] { return tid.load() != 0; }));
  }
  void step(int next) {
    go = next;
    EXPECT_TRUE(eventually([&] { return state.load() == next; }));
  }
  ~worker() {
    go = 3;
    thread.join();
  }
};

TEST(IdleLane, AJobRunsIdleUntilItsDeadlineOrAWaiterLiftsIt) {
  if (!idle_priority_reversible()) GTEST_SKIP() << "this process may not leave SCHED_IDLE";
  idle_lane lane(200ms);
  worker w(lane);
  EXPECT_EQ(policy_of(w.tid), SCHED_IDLE);

  w.step(1);  // a job past its deadline is lifted by the lane's own thread
  EXPECT_TRUE(eventually([&] { return policy_of(w.tid) == SCHED_OTHER; }));
  EXPECT_EQ(lane.lifts(), 1u);
  w.step(2);
  EXPECT_EQ(policy_of(w.tid), SCHED_IDLE) << "the next job starts in the background again";

  w.step(1);  // a waiter lifts at once
  lane.lift();
  EXPECT_EQ(policy_of(w.tid), SCHED_OTHER);
  w.step(2);
  EXPECT_EQ(policy_of(w.tid), SCHED_IDLE);
  EXPECT_EQ(lane.lifts(), 2u);
}

TEST(IdleLane, AJobThatEndsInTimeIsNeverLifted) {
  if (!idle_priority_reversible()) GTEST_SKIP() << "this process may not leave SCHED_IDLE";
  idle_lane lane(10s);
  worker w(lane);
  for (int i = 0; i < 5; ++i) {
    w.step(1);
    w.step(2);
  }
  EXPECT_EQ(lane.lifts(), 0u);
  EXPECT_EQ(policy_of(w.tid), SCHED_IDLE);
}

// The point of the deadline: on a core that never idles, a SCHED_IDLE thread gets almost
// nothing (~0.3 % of the core), so 50 ms of work would take many seconds; lifted after
// 100 ms it finishes in well under a second.
TEST(IdleLane, ADeadlineEndsStarvationOnABusyCore) {
  if (!idle_priority_reversible()) GTEST_SKIP() << "this process may not leave SCHED_IDLE";
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  std::atomic<bool> stop{false};
  std::thread spinner([&] {  // normal priority, always runnable, on core 0
    (void)::sched_setaffinity(0, sizeof one, &one);
    while (!stop.load()) {
    }
  });
  idle_lane lane(100ms);
  std::atomic<bool> done{false};
  std::thread background([&] {
    (void)::sched_setaffinity(0, sizeof one, &one);
    lane.join();
    lane.job_started();
    timespec start{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    for (;;) {  // 50 ms of this thread's own CPU time
      timespec now{};
      ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
      if ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 >= 50) break;
    }
    lane.job_finished();
    done = true;
  });
  const bool finished = eventually([&] { return done.load(); }, 5000ms);
  stop = true;
  if (!finished) lane.lift();  // let it end in any case
  background.join();
  spinner.join();
  EXPECT_TRUE(finished) << "the job starved past its deadline";
  EXPECT_EQ(lane.lifts(), 1u);
}

}  // namespace
}  // namespace troupe::sys
