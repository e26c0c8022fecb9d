#pragma once
// The one-line progress display of a training job: step/total, loss, tokens/s and ETA,
// redrawn in place on a terminal and printed every few percent otherwise.

#include <chrono>
#include <cstdint>
#include <string>

namespace troupe::monitoring {

/// Formats `v` with `digits` decimals.
std::string format_fixed(double v, int digits);
/// "1h02m", "3m07s", "12s".
std::string format_duration(double seconds);
/// "12.3k", "1.20M".
std::string format_rate(double per_second);

class progress_line {
 public:
  /// `start_step`: steps already done before this run (resume), excluded from the ETA.
  explicit progress_line(int64_t start_step);
  void update(int64_t step, int64_t total, double loss, double tokens_per_s);
  /// A line of its own (validation results, checkpoints), printed above the progress line.
  void note(const std::string& text);
  void finish();

 private:
  void draw(const std::string& line, bool force);

  int64_t start_step_;
  bool tty_;
  bool open_ = false;  // a line drawn with \r and not yet ended
  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::time_point last_print_;
  int64_t last_step_ = 0;
  int64_t last_total_ = 0;
  std::string last_line_;
};

}  // namespace troupe::monitoring
