// The hooks chaos/ installs at the lower layers' injection points (chaos/hooks.hpp): a pause
// inside each checkpoint commit, set directly or from TROUPE_CHAOS_COMMIT_PAUSE_MS.

#include "chaos/hooks.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "runtime/sys/fault_point.hpp"

namespace troupe::chaos {
namespace {

using namespace std::chrono;

// How long reaching the checkpoint injection point takes.
milliseconds time_commit_point() {
  const auto t0 = steady_clock::now();
  sys::hit(sys::fault_point::checkpoint_before_manifest, 7);
  return duration_cast<milliseconds>(steady_clock::now() - t0);
}

TEST(ChaosHooksTest, NoHookNoPause) {
  set_commit_pause(milliseconds(0));
  EXPECT_LT(time_commit_point(), milliseconds(50));
}

TEST(ChaosHooksTest, ACommitPauseHoldsTheCommitPoint) {
  set_commit_pause(milliseconds(150));
  EXPECT_GE(time_commit_point(), milliseconds(150));
  set_commit_pause(milliseconds(0));
  EXPECT_LT(time_commit_point(), milliseconds(50));
}

TEST(ChaosHooksTest, TheEnvironmentSetsTheCommitPause) {
  ::setenv(commit_pause_env, "120", 1);
  install_hooks_from_environment();
  ::unsetenv(commit_pause_env);
  EXPECT_GE(time_commit_point(), milliseconds(120));
  // Unset, the environment leaves the hook as it is.
  install_hooks_from_environment();
  EXPECT_GE(time_commit_point(), milliseconds(120));
  set_commit_pause(milliseconds(0));
}

}  // namespace
}  // namespace troupe::chaos
