#include "runtime/optim/adamw.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace troupe {

adamw::adamw(const optim_config& cfg, const std::vector<param_tensor>& table, size_t num_params)
    : cfg_(cfg), m_(num_params, 0.0f), v_(num_params, 0.0f) {
  auto fail = [](const std::string& why) { throw std::invalid_argument("adamw: " + why); };
  if (!(cfg.lr >= 0)) fail("lr must be >= 0");
  if (!(cfg.beta1 >= 0 && cfg.beta1 < 1 && cfg.beta2 >= 0 && cfg.beta2 < 1)) {
    fail("beta1 and beta2 must lie in [0, 1)");
  }
  if (!(cfg.eps > 0)) fail("eps must be > 0");
  if (!(cfg.weight_decay >= 0)) fail("weight_decay must be >= 0");
  if (!(cfg.grad_clip >= 0)) fail("grad_clip must be >= 0 (0 turns clipping off)");
  if (!(cfg.min_lr_ratio >= 0 && cfg.min_lr_ratio <= 1)) fail("min_lr_ratio must lie in [0, 1]");
  if (cfg.warmup_steps < 0) fail("warmup_steps must be >= 0");

  // Cover [0, num_params) with ranges: decay (or freezing) where the table says so, plain
  // updates elsewhere.
  std::vector<range> decayed;
  for (const param_tensor& t : table) {
    if (t.offset + t.numel > num_params) {
      fail("tensor '" + t.name + "' lies outside the " + std::to_string(num_params) +
           " parameters");
    }
    const bool frozen = is_frozen(cfg.freeze, t.name);
    if ((t.decay || frozen) && t.numel > 0)
      decayed.push_back({t.offset, t.offset + t.numel, t.decay, frozen});
  }
  std::sort(decayed.begin(), decayed.end(),
            [](const range& a, const range& b) { return a.begin < b.begin; });
  size_t at = 0;
  for (const range& r : decayed) {
    if (r.begin < at) fail("overlapping tensors in the table");
    if (r.begin > at) ranges_.push_back({at, r.begin, false});
    ranges_.push_back(r);
    at = r.end;
  }
  if (at < num_params) ranges_.push_back({at, num_params, false});
}

bool adamw::is_frozen(const std::string& patterns, const std::string& name) {
  size_t at = 0;
  while (at <= patterns.size()) {
    const size_t comma = std::min(patterns.find(',', at), patterns.size());
    const std::string pattern = patterns.substr(at, comma - at);
    at = comma + 1;
    if (pattern.empty()) continue;
    const bool glob = pattern.find('*') != std::string::npos;
    if (glob ? ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0
             : name.find(pattern) != std::string::npos)
      return true;
  }
  return false;
}

double scheduled_lr(const optim_config& cfg, int64_t step, int64_t total_steps) {
  const double peak = cfg.lr;
  const double floor = cfg.lr * cfg.min_lr_ratio;
  if (step < cfg.warmup_steps) {
    return peak * static_cast<double>(step + 1) / static_cast<double>(cfg.warmup_steps);
  }
  const bool rebased = cfg.rebase_step > 0 && step >= cfg.rebase_step;
  const int64_t from = rebased ? cfg.rebase_step : cfg.warmup_steps;
  const double start = rebased ? cfg.rebase_lr : peak;
  const int64_t decay_steps = total_steps - from;
  if (decay_steps <= 0) return rebased ? floor : peak;
  const double progress =
      std::clamp(static_cast<double>(step - from) / static_cast<double>(decay_steps), 0.0, 1.0);
  return floor + 0.5 * (start - floor) * (1.0 + std::cos(std::numbers::pi * progress));
}

double adamw::grad_norm(const float* grads, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(grads[i]) * grads[i];
  return std::sqrt(sum);
}

double adamw::clip_scale(double norm) const {
  if (cfg_.grad_clip > 0 && std::isfinite(norm) && norm > cfg_.grad_clip) {
    return cfg_.grad_clip / (norm + 1e-6);
  }
  return 1.0;
}

void adamw::clip_to_norm(float* grads, size_t n, double global_norm) const {
  const double scale = clip_scale(global_norm);
  if (scale == 1.0) return;
  const auto s = static_cast<float>(scale);
  for (size_t i = 0; i < n; ++i) grads[i] *= s;
}

double adamw::clip_gradients(float* grads, size_t n) const {
  const double norm = grad_norm(grads, n);
  clip_to_norm(grads, n, norm);
  return norm;
}

void adamw::step(float* params, const float* grads, int64_t step, int64_t total_steps) {
  ++t_;
  const double lr = learning_rate(step, total_steps);
  const auto b1 = static_cast<float>(cfg_.beta1);
  const auto b2 = static_cast<float>(cfg_.beta2);
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  // p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps): PyTorch's arrangement of the same update.
  const auto step_size = static_cast<float>(lr / bc1);
  const auto inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const auto eps = static_cast<float>(cfg_.eps);
  float* m = m_.data();
  float* v = v_.data();
  for (const range& r : ranges_) {
    if (r.frozen) continue;  // neither moments nor parameters move
    const float keep = r.decay ? static_cast<float>(1.0 - lr * cfg_.weight_decay) : 1.0f;
    for (size_t i = r.begin; i < r.end; ++i) {
      const float g = grads[i];
      m[i] = b1 * m[i] + (1.0f - b1) * g;
      v[i] = b2 * v[i] + (1.0f - b2) * g * g;
      const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
      params[i] = params[i] * keep - step_size * m[i] / denom;
    }
  }
}

}  // namespace troupe
