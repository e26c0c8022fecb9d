#pragma once
// A stream of independent jobs that the thread producing them shares with a few helper
// threads while it goes on producing: for example a checkpoint writer hashes its chunks in
// order (deduplication and observers need the order) while helpers write the new chunk files.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::sys {

/// How many helpers a caller may use beside itself to share one job stream: none under
/// SCHED_IDLE (background work there must not spread over more cores; its speed matters
/// less than the CPU it takes), else one fewer than the cores, at most `at_most`.
unsigned helpers_for_this_thread(unsigned at_most) noexcept;

/// Jobs added by one producer thread, run by it and by `helpers` threads started at
/// construction. With no helper, add() runs each job at once on the producer. The first job
/// that throws stops the rest: jobs not started yet are dropped, add() and finish() rethrow
/// its exception. The destructor waits for every job that has started.
class shared_work {
 public:
  explicit shared_work(unsigned helpers);
  ~shared_work();
  shared_work(const shared_work&) = delete;
  shared_work& operator=(const shared_work&) = delete;

  /// From the producer: queues `job` (or runs it, without helpers). Throws a failed job's
  /// exception, so the producer stops early.
  void add(std::function<void()> job);
  /// From the producer, once its last add() is done: helps until every job has ended, then
  /// rethrows the first failure, if any.
  void finish();

 private:
  void help();
  bool run_next(std::unique_lock<std::mutex>& lock);  // false when nothing was queued
  void rethrow_failure();

  std::mutex mutex_;
  std::condition_variable queued_;    // a job was added, or the producer is done adding
  std::condition_variable finished_;  // a job ended
  std::deque<std::function<void()>> queue_;
  size_t running_ = 0;
  bool closed_ = false;  // no more jobs will be added
  std::exception_ptr failure_;
  std::vector<std::thread> helpers_;
};

}  // namespace troupe::sys
