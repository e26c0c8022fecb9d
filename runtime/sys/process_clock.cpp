#include "runtime/sys/process_clock.hpp"

#include <atomic>

namespace troupe::sys {
namespace {
// Read while the program's static objects are made, before main runs.
const std::chrono::steady_clock::time_point started_at = std::chrono::steady_clock::now();
std::atomic<std::chrono::steady_clock::rep> job_started_at{0};
}  // namespace

std::chrono::steady_clock::time_point process_started() { return started_at; }

void mark_job_started() {
  job_started_at.store(std::chrono::steady_clock::now().time_since_epoch().count());
}

std::chrono::steady_clock::time_point job_started() {
  const auto at = job_started_at.load();
  return at == 0 ? started_at
                 : std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(at));
}

}  // namespace troupe::sys
