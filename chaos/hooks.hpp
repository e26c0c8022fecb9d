#pragma once
// The process-wide fault hooks chaos/ installs at the injection points of the layers below it
// (runtime/sys/fault_point.hpp): today a pause inside each checkpoint commit.

#include <chrono>

namespace troupe::chaos {

/// The environment variable that holds each checkpoint commit that many milliseconds after its
/// shards are verified and before its manifest is written (format 2 and later), so that a
/// crash-consistency test can kill the coordinator inside that window.
inline constexpr const char* commit_pause_env = "TROUPE_CHAOS_COMMIT_PAUSE_MS";

/// Holds every later checkpoint commit of this process for `pause` before its manifest is
/// written; zero removes the hook.
void set_commit_pause(std::chrono::milliseconds pause);

/// Installs the hooks the environment asks for (TROUPE_CHAOS_COMMIT_PAUSE_MS); a variable that
/// is not set leaves the hook as it is. The coordinator calls it once, at start.
void install_hooks_from_environment();

}  // namespace troupe::chaos
