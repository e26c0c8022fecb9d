#pragma once
// Background threads that take only what training leaves. The ranks of a step run in lock
// step, so a core taken from one rank stalls them all; but a step also leaves cores idle (a
// rank waits for its peers in a collective, or for the coordinator). A thread under
// SCHED_IDLE runs there, and a rank that wakes up gets its core back at once. Measured with a
// checkpoint every 10 steps (docs/BENCHMARKS.md, issue 9): the steps after a checkpoint
// slowed by a third as much as with the writers at nice 10. Such a thread must not starve,
// though: on cores that never idle it would make almost no progress. So each piece of its
// work has a deadline, after which it moves back to the normal scheduler (its nice value
// stays), and so does a thread that someone is about to wait for.

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace troupe::sys {

/// Whether a thread of this process may leave SCHED_IDLE again (root, CAP_SYS_NICE, or an
/// RLIMIT_NICE that allows nice 10). Without it, idle_lane keeps its worker at the normal
/// scheduler: a thread that could not be lifted might starve.
bool idle_priority_reversible();

/// Puts the calling thread under SCHED_IDLE and returns its thread id. Best effort: a
/// kernel that refuses leaves the thread as it was.
pid_t enter_idle_priority() noexcept;

/// Moves thread `tid` back to the normal scheduler. Best effort.
void leave_idle_priority(pid_t tid) noexcept;

/// Runs one worker thread's jobs at idle priority, each for at most `patience` before the
/// worker is lifted to the normal scheduler until that job ends. A small thread of its own
/// keeps the deadline, since the worker may be the one that cannot run.
class idle_lane {
 public:
  explicit idle_lane(std::chrono::milliseconds patience);
  ~idle_lane();
  idle_lane(const idle_lane&) = delete;
  idle_lane& operator=(const idle_lane&) = delete;

  /// From the worker thread, once: it runs at idle priority from now on (if that can be
  /// undone, see idle_priority_reversible).
  void join();
  /// From the worker thread: a job starts (its deadline with it) / has ended.
  void job_started();
  void job_finished();
  /// From any thread about to wait for the worker: lifted until its current or next job ends.
  void lift();
  /// How many jobs were lifted, by a deadline or a waiter (for tests and reports).
  [[nodiscard]] size_t lifts() const;

 private:
  void keep_deadlines();
  void lift_locked();

  const std::chrono::milliseconds patience_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  pid_t worker_ = 0;
  bool lifted_ = false;
  bool in_job_ = false;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point deadline_;
  size_t lifts_ = 0;
  std::thread watchdog_;
};

}  // namespace troupe::sys
