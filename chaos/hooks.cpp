#include "chaos/hooks.hpp"

#include <atomic>
#include <cstdlib>
#include <thread>

#include "runtime/sys/fault_point.hpp"

namespace troupe::chaos {
namespace {

std::atomic<int64_t> commit_pause_ms{0};

void on_fault_point(sys::fault_point point, int64_t /*step*/) {
  switch (point) {
    case sys::fault_point::checkpoint_before_manifest:
      if (const int64_t ms = commit_pause_ms.load(std::memory_order_relaxed); ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      break;
  }
}

}  // namespace

void set_commit_pause(std::chrono::milliseconds pause) {
  commit_pause_ms.store(pause.count(), std::memory_order_relaxed);
  sys::set_fault_hook(pause.count() > 0 ? &on_fault_point : nullptr);
}

void install_hooks_from_environment() {
  if (const char* text = std::getenv(commit_pause_env))
    set_commit_pause(std::chrono::milliseconds(std::atoi(text)));
}

}  // namespace troupe::chaos
