#include "monitoring/log.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

#include "runtime/sys/printable.hpp"

namespace troupe::monitoring {

namespace {

// The threshold is process-wide on purpose: stderr is process-wide too.
std::atomic<int> threshold_value{-1};  // -1: not yet read from the environment

level threshold_from_env() {
  const char* env = std::getenv("TROUPE_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return level::info;
  if (auto parsed = parse_level(env)) return *parsed;
  std::string warning = std::string("[troupe] warn: TROUPE_LOG_LEVEL='") + env +
                        "' is not one of debug|info|warn|error; using info\n";
  std::fputs(warning.c_str(), stderr);
  return level::info;
}

std::mutex& stderr_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

std::optional<level> parse_level(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "debug") return level::debug;
  if (lower == "info") return level::info;
  if (lower == "warn" || lower == "warning") return level::warn;
  if (lower == "error") return level::error;
  return std::nullopt;
}

std::string_view level_name(level lvl) {
  switch (lvl) {
    case level::debug:
      return "debug";
    case level::info:
      return "info";
    case level::warn:
      return "warn";
    case level::error:
      return "error";
  }
  return "unknown";
}

level log_threshold() {
  int value = threshold_value.load(std::memory_order_relaxed);
  if (value < 0) {
    // Two threads may both read the environment the first time; they agree on the answer,
    // and compare_exchange keeps a set_log_threshold() that raced ahead of them.
    int expected = -1;
    const int from_env = static_cast<int>(threshold_from_env());
    threshold_value.compare_exchange_strong(expected, from_env, std::memory_order_relaxed);
    value = threshold_value.load(std::memory_order_relaxed);
  }
  return static_cast<level>(value);
}

void set_log_threshold(level lvl) {
  threshold_value.store(static_cast<int>(lvl), std::memory_order_relaxed);
}

bool log_enabled(level lvl) { return static_cast<int>(lvl) >= static_cast<int>(log_threshold()); }

std::string format_log_line(level lvl, const log_context& ctx, std::string_view msg) {
  std::string line = "[troupe";
  if (!ctx.role.empty()) line += " " + ctx.role;
  if (ctx.rank >= 0) line += " rank=" + std::to_string(ctx.rank);
  if (ctx.generation > 0) line += " gen=" + std::to_string(ctx.generation);
  if (ctx.step >= 0) line += " step=" + std::to_string(ctx.step);
  line += "] ";
  // info is the everyday level and carries no tag, so ordinary output stays short.
  if (lvl != level::info) {
    line += level_name(lvl);
    line += ": ";
  }
  // Messages carry text from outside (file names, bytes of a damaged file, peers' errors):
  // one escaping keeps every line one valid UTF-8 line that a terminal only displays.
  if (!msg.empty() && msg.back() == '\n') msg.remove_suffix(1);
  line += sys::printable(msg, 16384);
  line += '\n';
  return line;
}

std::string utc_timestamp(std::chrono::system_clock::time_point at) {
  const auto since_epoch = at.time_since_epoch();
  const auto seconds = std::chrono::floor<std::chrono::seconds>(since_epoch);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch - seconds);
  const std::time_t t = seconds.count();
  std::tm utc{};
  gmtime_r(&t, &utc);
  char buf[96];  // room for any int the format could be given
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<int>(millis.count()));
  return buf;
}

void log(level lvl, const log_context& ctx, std::string_view msg) {
  if (!log_enabled(lvl)) return;
  const std::string line =
      utc_timestamp(std::chrono::system_clock::now()) + " " + format_log_line(lvl, ctx, msg);
  std::lock_guard lock(stderr_mutex());
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace troupe::monitoring
