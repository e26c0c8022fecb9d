#pragma once
// Central finite differences for the gradient tests: the numeric gradient of a scalar
// function of a buffer, and the worst disagreement with an analytic gradient.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <random>
#include <vector>

namespace troupe::testing {

/// Worst relative disagreement max_i |a_i - n_i| / (max(|a_i|, |n_i|) + floor) between
/// the analytic gradient a and the fourth-order central difference
///   n_i = (-f(x + 2h e_i) + 8 f(x + h e_i) - 8 f(x - h e_i) + f(x - 2h e_i)) / 12h
/// over the coordinates in `which` (all when empty). x is restored afterwards.
/// In double precision with h = 1e-4 the truncation error is O(h^4 f^(5)) ~ 1e-16 and
/// the rounding error ~1e-16 |f| / h ~ 1e-12 |f|, so a correct gradient scores ~1e-7 at
/// worst (on the smallest gradients, through the floor).
inline double gradcheck(const std::function<double()>& f, double* x, const double* analytic,
                        size_t n, std::vector<size_t> which = {}, double h = 1e-4,
                        double floor = 1e-4) {
  if (which.empty()) {
    which.resize(n);
    for (size_t i = 0; i < n; ++i) which[i] = i;
  }
  double worst = 0;
  for (size_t i : which) {
    const double saved = x[i];
    auto at = [&](double v) {
      x[i] = v;
      return f();
    };
    const double numeric =
        (-at(saved + 2 * h) + 8 * at(saved + h) - 8 * at(saved - h) + at(saved - 2 * h)) / (12 * h);
    x[i] = saved;
    const double err = std::abs(analytic[i] - numeric) /
                       (std::max(std::abs(analytic[i]), std::abs(numeric)) + floor);
    worst = std::max(worst, err);
  }
  return worst;
}

/// Tolerance for gradcheck in double precision: 1e-6, ten times above the worst error
/// measured for correct gradients and far below that of any real mistake (a wrong factor
/// or a missing term is an O(1) relative error on some coordinate).
constexpr double gradcheck_tolerance = 1e-6;

/// n standard-normal values scaled by `scale`, from a fixed seed.
inline std::vector<double> random_vector(size_t n, unsigned seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

/// sum_i a_i * b_i: the scalar objective that makes dout = b for a layer output a.
inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace troupe::testing
