#include "actors/coordinator/straggler_detector.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace troupe::actors {
namespace {

constexpr double nan = std::numeric_limits<double>::quiet_NaN();

double median_of(std::vector<double> v) {
  if (v.empty()) return nan;
  const auto mid = static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[static_cast<size_t>(mid)];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return lower + (upper - lower) / 2;  // (lower + upper) / 2 overflows near DBL_MAX
}

// How many times slower than `base` the window's steps are: the geometric mean of their ratios
// to `base`, without the slowest step and with each ratio capped at `cap` either way. A mean
// uses every step (a median of the window needs about 1.6x the steps for the same noise); the
// cap and the dropped step keep one or two spikes of a healthy rank from adding up to a flag,
// while a rank slowed in every step cannot hide.
double slowness(const std::vector<double>& window, double base, double cap) {
  std::vector<double> logs;
  logs.reserve(window.size());
  for (double t : window) logs.push_back(std::min(cap, std::max(-cap, std::log(t / base))));
  std::sort(logs.begin(), logs.end());
  double sum = 0;
  for (size_t i = 0; i + 1 < logs.size(); ++i) sum += logs[i];
  return std::exp(sum / static_cast<double>(logs.size() - 1));
}

}  // namespace

straggler_detector::straggler_detector(straggler_options opts) : opts_(opts) {
  opts_.window = std::max(2, opts_.window);  // one step is dropped from each window
  opts_.consecutive = std::max(1, opts_.consecutive);
}

void straggler_detector::reset() {
  windows_.clear();
  above_.clear();
  flagged_.clear();
  scores_.clear();
  smoothed_.clear();
}

std::vector<straggler_verdict> straggler_detector::observe(const std::vector<double>& compute_s) {
  const size_t n = compute_s.size();
  if (windows_.size() < n) {
    windows_.resize(n);
    above_.resize(n, 0);
    flagged_.resize(n, false);
    scores_.resize(n, 1.0);
    smoothed_.resize(n, nan);
  }
  const auto window = static_cast<size_t>(opts_.window);
  // Judged this step: ranks that reported and have a full window; the first steps of a
  // generation (allocation, cold caches) are noisy and a short window is easily fooled.
  std::vector<size_t> judged;
  for (size_t r = 0; r < n; ++r) {
    const double t = compute_s[r];
    if (!std::isfinite(t) || t < 0) continue;
    auto& w = windows_[r];
    w.push_back(t);
    if (w.size() > window) w.erase(w.begin());
    if (w.size() < window) {
      above_[r] = 0;
      continue;
    }
    smoothed_[r] = median_of(w);
    judged.push_back(r);
  }
  // A rank is compared with the others only, never with itself: in a world of 2 the median
  // of all would sit halfway to the straggler. The others' steps are pooled, so one noisy
  // step or one noisy rank barely moves the baseline.
  const double cap = 2 * std::log(opts_.factor);
  std::vector<straggler_verdict> out;
  std::vector<double> pool, spread;
  for (size_t r : judged) {
    pool.clear();
    spread.clear();
    for (size_t q : judged) {
      if (q == r) continue;
      pool.insert(pool.end(), windows_[q].begin(), windows_[q].end());
    }
    const double base = median_of(pool);
    if (!(base > 0)) {  // alone, or the others take no time: nothing to compare with
      scores_[r] = 1.0;
      above_[r] = 0;
      flagged_[r] = false;
      continue;
    }
    for (size_t q : judged)
      if (q != r) spread.push_back(std::abs(smoothed_[q] - base));
    const double mad = std::max(median_of(spread), 0.02 * base);
    // What is shown is the plain ratio of medians; what decides is the steadier slowness,
    // whose cap would understate a badly slowed rank.
    scores_[r] = smoothed_[r] / base;
    const double slow_by = slowness(windows_[r], base, cap);
    // The floor is checked on the median, not on the capped slowness, which would hide a
    // rank slowed 6x when the others take 0.5 ms.
    const bool slow = slow_by > opts_.factor && slow_by * base > base + opts_.mad_k * mad &&
                      smoothed_[r] - base >= opts_.min_excess_s;
    if (!slow) {
      above_[r] = 0;
      flagged_[r] = false;
      continue;
    }
    if (++above_[r] >= opts_.consecutive && !flagged_[r]) {
      flagged_[r] = true;
      out.push_back({static_cast<int>(r), scores_[r]});
    }
  }
  return out;
}

}  // namespace troupe::actors
