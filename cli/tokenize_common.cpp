// What the parts of `troupe tokenize` share: its failures' messages and its progress line.

#include "cli/tokenize_common.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <utility>

namespace troupe::cli::tokenize {

usage_error bad_input(const std::string& what) { return usage_error(command + ": " + what); }

std::string errno_text(int e) { return std::strerror(e); }

std::string spm_message(const sentencepiece::util::Status& status) {
  std::string m = status.error_message();
  if (m.starts_with("./src/") || m.starts_with("src/"))
    if (const size_t close = m.find("] "); close != std::string::npos) m.erase(0, close + 2);
  while (!m.empty() && (m.back() == ' ' || m.back() == '\n')) m.pop_back();
  return m;
}

std::string megabytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

progress::progress(std::string what)
    : what_(std::move(what)),
      tty_(::isatty(STDERR_FILENO) == 1),
      period_(tty_ ? 1 : 10),
      start_(steady::now()) {}

progress::~progress() {
  if (drawn_ && tty_) std::fputs("\n", stderr);
}

void progress::update(uint64_t done, uint64_t total) {
  const auto now = steady::now();
  if (now - start_ < std::chrono::seconds(1) || now - last_ < period_) return;
  last_ = now;
  drawn_ = true;
  const double secs = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "%s%s: %s: %s of %s (%.1f MB/s)%s", tty_ ? "\r" : "", command.c_str(),
               what_.c_str(), megabytes(done).c_str(), megabytes(total).c_str(),
               static_cast<double>(done) / 1e6 / secs, tty_ ? "\033[K" : "\n");
  std::fflush(stderr);
}

}  // namespace troupe::cli::tokenize
