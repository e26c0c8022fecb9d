#include "actors/straggler_detector.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::actors {
namespace {

double median_of(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double m = v[mid];
  if (v.size() % 2 == 0)
    m = (m + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid))) / 2;
  return m;
}

}  // namespace

straggler_detector::straggler_detector(straggler_options opts) : opts_(opts) {}

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
  }
  // Each rank's smoothed time: the median of its last `window` reports.
  std::vector<double> smoothed(n, std::nan(""));
  for (size_t r = 0; r < n; ++r) {
    const double t = compute_s[r];
    if (std::isfinite(t) && t >= 0) {
      auto& w = windows_[r];
      w.push_back(t);
      if (static_cast<int>(w.size()) > std::max(1, opts_.window)) w.erase(w.begin());
    }
    // Judged only on a full window: the first steps (allocation, caches) are noisy.
    if (static_cast<int>(windows_[r].size()) >= std::max(1, opts_.window))
      smoothed[r] = median_of(windows_[r]);
  }
  smoothed_ = smoothed;
  std::vector<straggler_verdict> out;
  for (size_t r = 0; r < n; ++r) {
    if (!std::isfinite(smoothed[r])) continue;
    // The others' median: a rank is not compared with itself.
    std::vector<double> others;
    for (size_t q = 0; q < n; ++q)
      if (q != r && std::isfinite(smoothed[q])) others.push_back(smoothed[q]);
    if (others.empty()) continue;
    const double med = median_of(others);
    if (!(med > 0)) continue;
    std::vector<double> dev;
    for (double x : others) dev.push_back(std::abs(x - med));
    const double mad = std::max(median_of(dev), 0.02 * med);
    const double score = smoothed[r] / med;
    scores_[r] = score;
    const bool slow = score > opts_.factor && smoothed[r] > med + opts_.mad_k * mad;
    above_[r] = slow ? above_[r] + 1 : 0;
    if (!slow) flagged_[r] = false;
    if (slow && above_[r] >= opts_.consecutive && !flagged_[r]) {
      flagged_[r] = true;
      out.push_back({static_cast<int>(r), score});
    }
  }
  return out;
}

}  // namespace troupe::actors
