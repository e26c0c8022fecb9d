// A minimal leveled logger that prefixes each stderr line with who is speaking (role, rank,
// generation, step).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace troupe::monitoring {

/// Severity, in increasing order.
enum class level { debug, info, warn, error };

/// Who is logging. Unset fields (empty role, rank -1, generation 0, step -1) are left out of
/// the prefix.
struct log_context {
  std::string role;              ///< "coordinator", "agent", "worker", ...
  int rank = -1;                 ///< the worker's rank in the current generation
  std::uint64_t generation = 0;  ///< the job's membership generation; 0 means "not yet"
  std::int64_t step = -1;        ///< the training step being worked on
};

/// Writes one line to stderr if `lvl` is at or above the threshold, e.g.
/// `2026-12-06T13:25:01.042Z [troupe coordinator gen=1 step=12] message` or
/// `2026-12-06T13:25:01.042Z [troupe worker rank=3] warn: message`.
/// Each line is written with one call under a lock, so lines from threads never interleave.
void log(level lvl, const log_context& ctx, std::string_view msg);

/// Whether a message at `lvl` would be written; lets callers skip building costly messages.
[[nodiscard]] bool log_enabled(level lvl);

/// The current threshold. Initially read from the environment variable TROUPE_LOG_LEVEL
/// (debug|info|warn|error; default info; an unknown value warns once and means info).
[[nodiscard]] level log_threshold();

/// Overrides the threshold for the whole process (a --log-level flag, or a test).
void set_log_threshold(level lvl);

/// Parses "debug", "info", "warn"/"warning" or "error" (case-insensitive).
[[nodiscard]] std::optional<level> parse_level(std::string_view text);

/// The lowercase name of a level.
[[nodiscard]] std::string_view level_name(level lvl);

/// `at` in UTC, ISO 8601 with milliseconds: 2026-12-06T13:25:01.042Z.
[[nodiscard]] std::string utc_timestamp(std::chrono::system_clock::time_point at);

/// The line log() would write after its timestamp, including the trailing newline.
[[nodiscard]] std::string format_log_line(level lvl, const log_context& ctx, std::string_view msg);

}  // namespace troupe::monitoring
