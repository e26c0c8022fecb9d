#pragma once
// `troupe status` and `troupe top`: the live view of a job (its coordinator's GET /status), or
// of a finished one from its events.jsonl.

#include <filesystem>
#include <string>
#include <vector>

namespace troupe::cli {

/// `troupe status ARGS` (top = false) or `troupe top ARGS`. Returns the exit code: 0, or 2
/// for bad arguments and a target that cannot be read (unreachable, refused, unauthorised).
int run_status_tool(const std::vector<std::string>& args, bool top);

std::string status_help();
std::string top_help();

}  // namespace troupe::cli
