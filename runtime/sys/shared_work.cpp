#include "runtime/sys/shared_work.hpp"

#include <sched.h>

#include <algorithm>

namespace troupe::sys {

unsigned helpers_for_this_thread(unsigned at_most) noexcept {
  if (::sched_getscheduler(0) == SCHED_IDLE) return 0;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return std::min(at_most, cores - 1);
}

shared_work::shared_work(unsigned helpers) {
  helpers_.reserve(helpers);
  try {
    for (unsigned i = 0; i < helpers; ++i) helpers_.emplace_back([this] { help(); });
  } catch (const std::system_error&) {
    // Fewer helpers than asked (threads exhausted): the producer does the rest itself.
  }
}

shared_work::~shared_work() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    queue_.clear();
  }
  queued_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void shared_work::add(std::function<void()> job) {
  if (helpers_.empty()) {
    rethrow_failure();
    try {
      job();
    } catch (...) {
      failure_ = std::current_exception();
      throw;
    }
    return;
  }
  {
    std::lock_guard lock(mutex_);
    if (failure_) std::rethrow_exception(failure_);
    queue_.push_back(std::move(job));
  }
  queued_.notify_one();
}

void shared_work::finish() {
  std::unique_lock lock(mutex_);
  closed_ = true;
  queued_.notify_all();
  while (run_next(lock)) {
  }
  finished_.wait(lock, [&] { return running_ == 0; });
  if (failure_) std::rethrow_exception(failure_);
}

void shared_work::rethrow_failure() {
  std::lock_guard lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
}

bool shared_work::run_next(std::unique_lock<std::mutex>& lock) {
  if (queue_.empty()) return false;
  std::function<void()> job = std::move(queue_.front());
  queue_.pop_front();
  ++running_;
  lock.unlock();
  std::exception_ptr failed;
  try {
    job();
  } catch (...) {
    failed = std::current_exception();
  }
  lock.lock();
  --running_;
  if (failed && !failure_) {
    failure_ = failed;
    queue_.clear();
  }
  finished_.notify_all();
  return true;
}

void shared_work::help() {
  std::unique_lock lock(mutex_);
  for (;;) {
    queued_.wait(lock, [&] { return closed_ || !queue_.empty(); });
    if (!run_next(lock) && closed_) return;
  }
}

}  // namespace troupe::sys
