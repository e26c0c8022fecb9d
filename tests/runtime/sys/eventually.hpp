#pragma once
// Waiting in tests of threads: the condition, not the time, is what a test asserts.

#include <chrono>
#include <thread>

namespace troupe::sys::testing {

/// Polls `done` every millisecond until it holds (true) or `limit` passes (false).
template <class Pred>
bool eventually(Pred done, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace troupe::sys::testing
