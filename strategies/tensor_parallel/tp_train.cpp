#include "strategies/tensor_parallel/tp_train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::tensor_parallel {

grad_result compute_tp_gradients(tp_gpt& m, const token_dataset& d, const train_config& cfg,
                                 int64_t step, int dp_rank, int dp_world) {
  // The same samples, micro-batches and B/G scaling as the single-rank step; the tp ranks
  // of one replica pass the same dp_rank and run each pass together.
  return compute_share_gradients(m, d, cfg, step, dp_rank, dp_world);
}

double clip_tp_gradients(tp_gpt& m, const adamw& opt) {
  const double norm = m.global_grad_norm();
  opt.clip_to_norm(m.grads(), m.num_params(), norm);
  return norm;
}

}  // namespace troupe::tensor_parallel
