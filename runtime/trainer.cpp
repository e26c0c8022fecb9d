#include "runtime/trainer.hpp"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe {

grad_result compute_gradients(gpt& m, const token_dataset& d, const train_config& cfg, int64_t step,
                              int rank, int world) {
  return compute_share_gradients(m, d, cfg, step, rank, world);
}

double evaluate(gpt& m, const token_dataset& d, const train_config& cfg) {
  return evaluate_model(m, d, cfg);
}

void set_blas_threads(int n) { openblas_set_num_threads(std::max(1, n)); }

}  // namespace troupe
