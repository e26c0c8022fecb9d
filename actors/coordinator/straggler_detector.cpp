#include "actors/coordinator/straggler_detector.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

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

// The median of m values from their order statistics (kth(0) the smallest), with median_of's
// rule for an even count, so that both give the same bits.
template <class KthSmallest>
double median_by_rank(size_t m, KthSmallest kth) {
  if (m == 0) return nan;
  const double upper = kth(m / 2);
  if (m % 2 == 1) return upper;
  const double lower = kth(m / 2 - 1);
  return lower + (upper - lower) / 2;
}

// The first index in [lo, hi) where `reached` holds (hi if none); it must hold from there on.
template <class Reached>
size_t first_where(size_t lo, size_t hi, Reached reached) {
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (reached(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// Every judged rank's window in one sorted pool, so that the median of the pool without one
// rank's share costs O(log^2 window) instead of a fresh O(ranks x window) selection. The k-th
// smallest of the rest is the smallest pooled value v with at least k + 1 of the rest <= v;
// that count is the pool's (kept per place) less the share's, and leaving out `window` values
// moves an order statistic by at most `window` places.
class pooled_windows {
 public:
  explicit pooled_windows(std::vector<double> values)
      : sorted_(std::move(values)), at_most_(sorted_.size()) {
    std::sort(sorted_.begin(), sorted_.end());
    for (size_t i = sorted_.size(); i-- > 0;)
      at_most_[i] =
          i + 1 < sorted_.size() && sorted_[i + 1] == sorted_[i] ? at_most_[i + 1] : i + 1;
  }

  /// The median of the pool less `share` (sorted; its values are in the pool).
  double median_without(std::span<const double> share) const {
    return median_by_rank(sorted_.size() - share.size(), [&](size_t k) {
      const auto rest_at_most = [&](size_t i) {
        const auto own = std::upper_bound(share.begin(), share.end(), sorted_[i]) - share.begin();
        return at_most_[i] - static_cast<size_t>(own);
      };
      // Values before place k that qualify equal the value at k, since their ties reach it.
      return sorted_[first_where(k, k + share.size() + 1,
                                 [&](size_t i) { return rest_at_most(i) >= k + 1; })];
    });
  }

 private:
  std::vector<double> sorted_;
  std::vector<size_t> at_most_;  ///< per place, how many pooled values are <= the one there
};

// Every judged rank's typical step, sorted once. Rounding is monotone, so |s - center| over
// the sorted values falls until the center and rises after it: how many lie within d of any
// center takes two binary searches, and the k-th smallest distance is the smallest one, on
// either side, with at least k + 1 distances <= it.
class pooled_typicals {
 public:
  explicit pooled_typicals(std::vector<double> values) : sorted_(std::move(values)) {
    std::sort(sorted_.begin(), sorted_.end());
  }

  /// The median of |s - center| over the values less one copy of `own` (one of them).
  double median_distance_without(double own, double center) const {
    const size_t n = sorted_.size();
    const auto split = static_cast<size_t>(
        std::lower_bound(sorted_.begin(), sorted_.end(), center) - sorted_.begin());
    const auto distance = [&](size_t i) { return std::abs(sorted_[i] - center); };
    const double own_distance = std::abs(own - center);
    const auto within = [&](double d) {
      const size_t below =
          split - first_where(0, split, [&](size_t i) { return distance(i) <= d; });
      const size_t above = first_where(split, n, [&](size_t i) { return distance(i) > d; }) - split;
      return below + above - (own_distance <= d ? 1 : 0);
    };
    return median_by_rank(n - 1, [&](size_t k) {
      const auto enough = [&](size_t i) { return within(distance(i)) >= k + 1; };
      const size_t up = first_where(split, n, enough);
      const size_t down = first_where(0, split, [&](size_t j) { return enough(split - 1 - j); });
      double kth = std::numeric_limits<double>::infinity();
      if (up < n) kth = distance(up);
      if (down < split) kth = std::min(kth, distance(split - 1 - down));
      return kth;
    });
  }

 private:
  std::vector<double> sorted_;
};

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
  std::vector<double> steps, typicals, shares;
  steps.reserve(judged.size() * window);
  shares.reserve(judged.size() * window);
  typicals.reserve(judged.size());
  for (size_t r : judged) {
    steps.insert(steps.end(), windows_[r].begin(), windows_[r].end());
    shares.insert(shares.end(), windows_[r].begin(), windows_[r].end());
    std::sort(shares.end() - static_cast<std::ptrdiff_t>(window), shares.end());
    typicals.push_back(smoothed_[r]);
  }
  const pooled_windows others_steps(std::move(steps));
  const pooled_typicals others_typicals(std::move(typicals));
  const double cap = 2 * std::log(opts_.factor);
  std::vector<straggler_verdict> out;
  for (size_t j = 0; j < judged.size(); ++j) {
    const size_t r = judged[j];
    const double base =
        others_steps.median_without(std::span<const double>(shares).subspan(j * window, window));
    if (!(base > 0)) {  // alone, or the others take no time: nothing to compare with
      scores_[r] = 1.0;
      above_[r] = 0;
      flagged_[r] = false;
      continue;
    }
    const double mad =
        std::max(others_typicals.median_distance_without(smoothed_[r], base), 0.02 * base);
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
