// `troupe report RUN_DIR [-o FILE]`: one self-contained HTML file (inline SVG charts and a table
// of headline numbers, no scripts, nothing fetched) drawn from a run's events.jsonl, finished
// or still running.
#pragma once

#include <string>
#include <vector>

namespace troupe::cli {

/// The help text of `troupe report`.
[[nodiscard]] std::string report_help();

/// Runs `troupe report` with the arguments after the command. Returns the exit code: 0 when
/// the report is written, 1 when it cannot be written. A run directory that is missing or
/// unreadable, or has no events.jsonl, and bad options throw usage_error (exit 2).
int run_report(const std::vector<std::string>& args);

}  // namespace troupe::cli
