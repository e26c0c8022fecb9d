#include "runtime/sys/idle_priority.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

namespace troupe::sys {

// sched_setscheduler with a thread id sets that thread alone on Linux.
pid_t enter_idle_priority() noexcept {
  const pid_t tid = ::gettid();
  const sched_param none{};
  (void)::sched_setscheduler(tid, SCHED_IDLE, &none);
  return tid;
}

void leave_idle_priority(pid_t tid) noexcept {
  if (tid <= 0) return;
  const sched_param none{};
  (void)::sched_setscheduler(tid, SCHED_OTHER, &none);
}

bool idle_priority_reversible() {
  // Probed once, on a thread of its own: the answer depends on privileges and limits that
  // the man page describes in several cases, and trying is the one sure test.
  static const bool reversible = [] {
    bool ok = false;
    std::thread probe([&ok] {
      const pid_t tid = ::gettid();
      (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), 10);
      const sched_param none{};
      ok = ::sched_setscheduler(tid, SCHED_IDLE, &none) == 0 &&
           ::sched_setscheduler(tid, SCHED_OTHER, &none) == 0;
    });
    probe.join();
    return ok;
  }();
  return reversible;
}

idle_lane::idle_lane(std::chrono::milliseconds patience) : patience_(patience) {
  watchdog_ = std::thread([this] { keep_deadlines(); });
}

idle_lane::~idle_lane() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  watchdog_.join();
}

void idle_lane::join() {
  std::lock_guard lock(mutex_);
  worker_ = ::gettid();
  if (!lifted_ && idle_priority_reversible()) (void)enter_idle_priority();
}

void idle_lane::job_started() {
  {
    std::lock_guard lock(mutex_);
    in_job_ = true;
    deadline_ = std::chrono::steady_clock::now() + patience_;
  }
  changed_.notify_all();
}

void idle_lane::job_finished() {
  std::lock_guard lock(mutex_);
  in_job_ = false;
  if (lifted_) {
    lifted_ = false;
    if (idle_priority_reversible()) (void)enter_idle_priority();
  }
}

void idle_lane::lift() {
  std::lock_guard lock(mutex_);
  lift_locked();
}

size_t idle_lane::lifts() const {
  std::lock_guard lock(mutex_);
  return lifts_;
}

void idle_lane::lift_locked() {
  if (lifted_) return;
  lifted_ = true;
  ++lifts_;
  leave_idle_priority(worker_);  // no worker yet: join() sees lifted_ and stays normal
}

void idle_lane::keep_deadlines() {
  pthread_setname_np(pthread_self(), "troupe-idle-dl");
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (!in_job_ || lifted_) {
      changed_.wait(lock);
      continue;
    }
    const auto deadline = deadline_;
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && in_job_ && !lifted_ &&
        deadline_ == deadline) {
      lift_locked();
    }
  }
}

}  // namespace troupe::sys
