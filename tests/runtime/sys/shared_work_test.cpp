// Shared work: every job runs once, helpers really take jobs while the producer goes on, a
// failed job stops the rest and reaches the producer, and no job outlives the destructor.

#include "runtime/sys/shared_work.hpp"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/sys/idle_priority.hpp"
#include "tests/runtime/sys/eventually.hpp"

namespace troupe::sys {
namespace {

using testing::eventually;

using namespace std::chrono_literals;

TEST(SharedWorkTest, EveryJobRunsExactlyOnce) {
  for (unsigned helpers : {0u, 1u, 3u}) {
    std::vector<std::atomic<int>> runs(500);
    shared_work work(helpers);
    for (auto& r : runs) work.add([&r] { r.fetch_add(1); });
    work.finish();
    for (size_t i = 0; i < runs.size(); ++i)
      ASSERT_EQ(runs[i].load(), 1) << "job " << i << " with " << helpers << " helpers";
  }
}

TEST(SharedWorkTest, AHelperTakesJobsWhileTheProducerGoesOn) {
  // The first job holds until a second thread has run another one: without a helper running
  // beside the producer, finish() would never get there.
  std::atomic<bool> other_ran{false};
  std::atomic<bool> held_in_time{false};
  std::mutex m;
  std::set<std::thread::id> threads;
  shared_work work(1);
  work.add([&] {
    held_in_time = eventually([&] { return other_ran.load(); });
    std::lock_guard lock(m);
    threads.insert(std::this_thread::get_id());
  });
  for (int i = 0; i < 3; ++i) {
    work.add([&] {
      other_ran = true;
      std::lock_guard lock(m);
      threads.insert(std::this_thread::get_id());
    });
  }
  work.finish();
  EXPECT_TRUE(held_in_time);
  EXPECT_EQ(threads.size(), 2u);
}

TEST(SharedWorkTest, WithoutHelpersAddRunsTheJobOnTheProducer) {
  shared_work work(0);
  std::thread::id ran_on;
  work.add([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_THROW(work.add([] { throw std::runtime_error("disk full"); }), std::runtime_error);
  bool ran_after = false;
  EXPECT_THROW(work.add([&] { ran_after = true; }), std::runtime_error);
  EXPECT_FALSE(ran_after);
  EXPECT_THROW(work.finish(), std::runtime_error);
}

TEST(SharedWorkTest, AFailedJobStopsTheRestAndReachesTheProducer) {
  std::atomic<int> ran{0};
  std::atomic<bool> failed{false};
  shared_work work(1);
  work.add([&] {
    failed = true;
    throw std::runtime_error("chunk file: No space left on device");
  });
  ASSERT_TRUE(eventually([&] { return failed.load(); }));
  // The helper has taken the failing job; once it has failed, add() says so.
  ASSERT_TRUE(eventually([&] {
    try {
      work.add([&] { ran.fetch_add(1); });
      return false;
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "chunk file: No space left on device");
      return true;
    }
  }));
  try {
    work.finish();
    ADD_FAILURE() << "finish() should rethrow the failure";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "chunk file: No space left on device");
  }
  // Jobs queued behind the failure may have run before it was seen; none runs after.
  const int seen = ran.load();
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(ran.load(), seen);
}

TEST(SharedWorkTest, TheDestructorWaitsForTheJobsInFlight) {
  std::atomic<bool> started{false}, ended{false}, release{false};
  std::thread releaser;
  {
    shared_work work(1);
    work.add([&] {
      started = true;
      while (!release) std::this_thread::yield();
      ended = true;
    });
    EXPECT_TRUE(eventually([&] { return started.load(); }));
    for (int i = 0; i < 10; ++i) work.add([] {});
    // The producer gives up (as when hashing throws) without finish(); the job in flight
    // must end before the work's memory goes.
    releaser = std::thread([&] {
      std::this_thread::sleep_for(30ms);
      release = true;
    });
  }
  EXPECT_TRUE(ended);
  releaser.join();
}

TEST(SharedWorkTest, NoHelpersUnderIdlePriority) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(helpers_for_this_thread(3), std::min(3u, cores - 1));
  EXPECT_EQ(helpers_for_this_thread(0), 0u);
  unsigned idle = 99;
  std::thread t([&] {
    enter_idle_priority();
    if (::sched_getscheduler(0) == SCHED_IDLE)
      idle = helpers_for_this_thread(3);
    else
      idle = 0;  // a kernel that refuses SCHED_IDLE: nothing to check
  });
  t.join();
  EXPECT_EQ(idle, 0u);
}

}  // namespace
}  // namespace troupe::sys
