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
  const int G = cfg.batch;
  const int T = cfg.model.context;
  if (dp_world < 1 || dp_rank < 0 || dp_rank >= dp_world || G < 1 || G % dp_world != 0 ||
      cfg.micro_batch < 1) {
    throw std::invalid_argument(
        "compute_tp_gradients: need 0 <= dp_rank < dp_world, dp_world dividing batch (" +
        std::to_string(G) + ") and micro_batch >= 1; got dp_rank " + std::to_string(dp_rank) +
        " of " + std::to_string(dp_world) + ", micro_batch " + std::to_string(cfg.micro_batch));
  }
  const int share = G / dp_world;
  const int first = dp_rank * share;
  const int mb = std::min(cfg.micro_batch, share);
  std::vector<uint8_t> inputs(static_cast<size_t>(mb) * T);
  std::vector<uint8_t> targets(inputs.size());

  grad_result r;
  m.zero_grads();
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < share; s += mb) {
    const int B = std::min(mb, share - s);
    d.fill_train(cfg.seed, step, first + s, B, T, inputs.data(), targets.data());
    // The same scaling as the single-rank step: B/G makes each micro-batch's mean-loss
    // gradient its part of the gradient of the mean over the global batch.
    const auto scale = static_cast<float>(static_cast<double>(B) / G);
    const double mean = m.forward_backward(inputs.data(), targets.data(), B, T, scale);
    r.loss_sum += mean * B * T;
    r.tokens += static_cast<int64_t>(B) * T;
  }
  r.compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
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

double evaluate_tp(tp_gpt& m, const byte_dataset& d, const train_config& cfg) {
  const int B = cfg.micro_batch;
  const int T = cfg.model.context;
  if (cfg.eval_batches < 1 || B < 1) {
    throw std::invalid_argument("evaluate_tp: eval_batches and micro_batch must be >= 1");
  }
  std::vector<uint8_t> inputs(static_cast<size_t>(B) * T);
  std::vector<uint8_t> targets(inputs.size());
  double sum = 0;
  for (int b = 0; b < cfg.eval_batches; ++b) {
    d.fill_val(cfg.seed, b, 0, B, T, inputs.data(), targets.data());
    sum += m.forward_loss(inputs.data(), targets.data(), B, T);
  }
  return sum / cfg.eval_batches;
}

}  // namespace troupe::tensor_parallel
