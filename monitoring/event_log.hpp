// An append-only file of JSON lines, one per job event (joins, failures, commits,
// reconfigurations), each stamped with the time and flushed at once.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace troupe::monitoring {

/// The file could not be opened or written, or the event was not a JSON object.
class event_log_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One JSON object per line ("JSON Lines"). Every line starts with "ts" (ISO-8601 UTC with
/// milliseconds, e.g. "2024-05-01T12:00:00.123Z") and "unix_ms" (milliseconds since the
/// epoch), followed by the caller's fields. Each line goes to the file in one write(2) on an
/// O_APPEND descriptor before write() returns, so a crash of the process loses nothing already
/// written, and several processes appending to one file do not split each other's lines. A
/// write the disk cuts short is taken back (truncated) when no one appended since; otherwise
/// the fragment is ended by the next line's write and readers skip it. Thread-safe.
/// Movable; a moved-from log throws on write().
class event_log {
 public:
  /// Opens `path` for appending, creating it if needed (not its directory). Throws
  /// event_log_error with the path and the OS's reason on failure.
  static event_log open(const std::string& path);

  event_log(event_log&&) noexcept;
  event_log& operator=(event_log&&) noexcept;
  ~event_log();

  /// Appends `object` with "ts" and "unix_ms" added (replacing fields of those names).
  /// Throws event_log_error if `object` is not a JSON object or the write fails. Every string
  /// (keys included) is escaped first, as `encode` does.
  void write(nlohmann::json object);

  /// `event` as one line of JSON (no newline), every string and key passed through
  /// sys::printable: the one encoding of an event wherever it goes (this file, a message
  /// between threads). Never throws on the content of strings.
  [[nodiscard]] static std::string encode(const nlohmann::json& event);
  /// Escapes every string and key of `value` in place, as `encode` does.
  static void make_printable(nlohmann::json& value);

  /// The path given to open().
  [[nodiscard]] const std::string& path() const;

 private:
  struct state;
  explicit event_log(std::unique_ptr<state> s);
  std::unique_ptr<state> state_;
};

/// `unix_ms` as ISO-8601 UTC with milliseconds: "YYYY-MM-DDTHH:MM:SS.mmmZ".
[[nodiscard]] std::string format_iso8601_utc(std::int64_t unix_ms);

}  // namespace troupe::monitoring
