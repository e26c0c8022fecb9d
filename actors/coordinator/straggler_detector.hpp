#pragma once
// Straggler verdicts as a pure function of per-step compute times: a rank whose compute stays
// slower than the other ranks' by a factor, for several steps in a row.

#include <vector>

namespace troupe::actors {

/// The defaults are tuned for noisy hosts (4 ranks on 2 cores: lognormal noise of sigma 0.15
/// per step and occasional 3x spikes). Simulated there, 0.1% of 300-step healthy runs flag a
/// rank; a rank slowed 2x is flagged within 8 steps, one slowed 1.5x within 10 steps in 96% of
/// runs. A shorter window or one step in a row reacts sooner and flags healthy ranks more often.
struct straggler_options {
  double factor = 1.3;  ///< flagged when slower than factor x the other ranks' typical step
  int window = 8;       ///< steps each rank's compute time is smoothed over (at least 2)
  int consecutive = 2;  ///< steps in a row above the threshold before a flag (at least 1)
  double mad_k = 3.0;   ///< also above median + mad_k x MAD of the other ranks (MAD >= 2% of it)
  /// ...and slower than the others by at least this many seconds per step. Below it a
  /// difference costs the job less than a step's control round trip (~1.5 ms here), and
  /// thread CPU times of sub-millisecond computes vary by that much with cache and scheduler
  /// noise from other processes: 4 healthy ranks computing 0.3 ms steps on a loaded host
  /// scored 1.4-2x.
  double min_excess_s = 0.002;
};

/// A rank newly found slow.
struct straggler_verdict {
  int rank;
  double factor;  ///< its score when flagged: its median step over the other ranks' median
};

/// Keeps a window of compute times per rank and flags a rank once its smoothed time stays
/// above factor x the others' median, median + mad_k x MAD and median + min_excess_s for
/// `consecutive` steps.
/// The smoothed time that decides is a spike-proof mean over the window (see the .cpp); the
/// score shown is the plain ratio of medians. A rank is only judged, and only counts for the
/// others, once its window is full. Each step costs O(ranks x (window x log(ranks x window) +
/// log^2 ranks)): the others' steps are one sorted pool less the rank's own share, found by
/// binary search (10,000 ranks: 21 ms a step here, where pooling afresh for each rank took 8 s).
class straggler_detector {
 public:
  explicit straggler_detector(straggler_options opts = {});

  /// One committed step: compute seconds per rank (index = rank; NaN, infinite or negative =
  /// no report this step, ignored). Returns the ranks newly flagged at this step; a rank is
  /// flagged once until it recovers below the threshold or is forgotten.
  std::vector<straggler_verdict> observe(const std::vector<double>& compute_s);
  /// The latest score per rank (the median of its window over the other ranks' median; 1.0 =
  /// typical), for the troupe_straggler_score metric. 1.0 for a rank not judged yet.
  const std::vector<double>& scores() const { return scores_; }
  /// Each rank's typical compute seconds (the median of its window); NaN before a full window.
  const std::vector<double>& smoothed() const { return smoothed_; }
  /// Forgets everything (the world changed: a new generation renumbers ranks).
  void reset();

 private:
  straggler_options opts_;
  std::vector<std::vector<double>> windows_;  ///< per rank, its last `window` reports, oldest first
  std::vector<int> above_;                    ///< per rank, steps in a row above the threshold
  std::vector<bool> flagged_;
  std::vector<double> scores_;
  std::vector<double> smoothed_;
};

}  // namespace troupe::actors
