#include "runtime/model/peak_flops.hpp"

#include <algorithm>
#include <vector>

#include "runtime/model/blas.hpp"
#include "runtime/trainer.hpp"

namespace troupe {

double measure_peak_flops(int threads, std::chrono::milliseconds budget) {
  using clock = std::chrono::steady_clock;
  // Large enough that the product is compute-bound, small enough (3 x 1 MiB) to stay in
  // cache and cost a few milliseconds a run.
  constexpr int n = 512;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size(), 0);
  set_blas_threads(threads);
  blas::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  double best = 0;
  const auto until = clock::now() + budget;
  for (int run = 0; run < 3 || clock::now() < until; ++run) {
    const auto t0 = clock::now();
    blas::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
    if (run > 1000) break;
  }
  return best;
}

}  // namespace troupe
