#pragma once
// Straggler verdicts as a pure function of per-step compute times: a rank whose smoothed
// compute time stays above a factor of the typical rank's for several steps in a row.

#include <vector>

namespace troupe::actors {

struct straggler_options {
  double factor = 1.3;  ///< flagged when slower than factor x the median rank
  int window = 5;       ///< steps each rank's compute time is smoothed over (median of its window)
  int consecutive = 3;  ///< steps in a row above the threshold before a flag
  double mad_k = 3.0;   ///< also above median + mad_k * MAD (MAD floors at 2% of the median)
};

struct straggler_verdict {
  int rank;
  double factor;  ///< the rank's smoothed time over the median
};

class straggler_detector {
 public:
  explicit straggler_detector(straggler_options opts = {});
  /// One committed step: compute seconds per rank (NaN or negative: no report, ignored).
  /// Returns the ranks newly flagged at this step.
  std::vector<straggler_verdict> observe(const std::vector<double>& compute_s);
  /// The latest score per rank (smoothed time / median; 1.0 = typical).
  const std::vector<double>& scores() const { return scores_; }
  /// Each rank's smoothed compute seconds (the median of its window); NaN before a full window.
  const std::vector<double>& smoothed() const { return smoothed_; }
  /// Forgets everything (a new generation renumbers ranks).
  void reset();

 private:
  straggler_options opts_;
  std::vector<std::vector<double>> windows_;
  std::vector<int> above_;
  std::vector<bool> flagged_;
  std::vector<double> scores_;
  std::vector<double> smoothed_;
};

}  // namespace troupe::actors
