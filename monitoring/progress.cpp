#include "monitoring/progress.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "runtime/sys/printable.hpp"

namespace troupe::monitoring {

std::string format_fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  auto total = static_cast<long>(s + 0.5);
  char buf[32];
  if (total >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", total / 3600, (total / 60) % 60);
  else if (total >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", total / 60, total % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", total);
  return buf;
}

std::string format_rate(double r) {
  char buf[32];
  if (r >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", r / 1e6);
  else if (r >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", r / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", r);
  return buf;
}

progress_line::progress_line(int64_t start_step)
    : start_step_(start_step),
      tty_(isatty(STDERR_FILENO) != 0),
      started_(std::chrono::steady_clock::now()),
      last_print_(started_) {}

void progress_line::update(int64_t step, int64_t total, double loss, double tokens_per_s) {
  using namespace std::chrono;
  double elapsed = duration<double>(steady_clock::now() - started_).count();
  int64_t done = step - start_step_;
  double eta =
      done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total - step) : NAN;
  std::string line = "step " + std::to_string(step) + "/" + std::to_string(total) + " | loss " +
                     format_fixed(loss, 4) + " | " + format_rate(tokens_per_s) + " tok/s | ETA " +
                     format_duration(eta);
  // Off a terminal, a line every ~5% (or 10 s) keeps logs readable.
  int64_t every = std::max<int64_t>(1, total / 20);
  bool force = step == total || step % every == 0;
  last_step_ = step;
  last_total_ = total;
  draw(line, force);
}

void progress_line::draw(const std::string& line, bool force) {
  auto now = std::chrono::steady_clock::now();
  last_line_ = line;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
    open_ = true;
  } else if (force || now - last_print_ > std::chrono::seconds(10)) {
    std::fprintf(stderr, "%s\n", line.c_str());
    last_print_ = now;
  }
}

void progress_line::note(const std::string& raw) {
  // A note can quote what a process or a peer said (a generation's reason): never let its
  // bytes steer the terminal.
  const std::string text = sys::printable(raw);
  if (tty_ && open_) {
    std::fprintf(stderr, "\r\033[K%s\n%s", text.c_str(), last_line_.c_str());
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  std::fflush(stderr);
}

void progress_line::finish() {
  if (tty_ && open_) std::fprintf(stderr, "\n");
  open_ = false;
}

}  // namespace troupe::monitoring
