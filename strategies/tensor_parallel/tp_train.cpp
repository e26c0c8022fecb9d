#include "strategies/tensor_parallel/tp_train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::tensor_parallel {

grad_result compute_tp_gradients(tp_gpt& m, const byte_dataset& d, const train_config& cfg,
                                 int64_t step, int dp_rank, int dp_world) {
  // The same samples, micro-batches and B/G scaling as the single-rank step; the tp ranks
  // of one replica pass the same dp_rank and run each pass together.
  return compute_share_gradients(m, d, cfg, step, dp_rank, dp_world);
}

double clip_tp_gradients(tp_gpt& m, const adamw& opt) {
  const double norm = m.global_grad_norm();
  const double scale = opt.clip_scale(norm);
  if (scale != 1.0) {
    // The same float factor on every rank and every slice, as clip_gradients applies it.
    const auto s = static_cast<float>(scale);
    float* g = m.grads();
    for (size_t i = 0; i < m.num_params(); ++i) g[i] *= s;
  }
  return norm;
}

double evaluate_tp(tp_gpt& m, const byte_dataset& d, const train_config& cfg) { return evaluate_model(m, d, cfg); }

}  // namespace troupe::tensor_parallel
