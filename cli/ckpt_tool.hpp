#pragma once
// `troupe ckpt`: offline tools for the checkpoints of a run directory (ls, inspect, verify,
// diff, gc).

#include <string>
#include <vector>

namespace troupe::cli {

/// Runs `troupe ckpt ARGS...` (args exclude "ckpt") and returns the exit code: 0 success,
/// 1 an error or a damaged checkpoint, 2 bad usage. Prints its own messages.
int run_ckpt_tool(const std::vector<std::string>& args);

}  // namespace troupe::cli
