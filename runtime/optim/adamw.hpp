#pragma once
// AdamW with decoupled weight decay, a warm-up + cosine learning-rate schedule and global
// gradient-norm clipping, over the flat parameter buffer of one rank.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/config.hpp"
#include "runtime/model/gpt.hpp"

namespace troupe {

/// The learning rate of 0-based `step` in a run of `total_steps`: linear warm-up over
/// warmup_steps reaching lr at step warmup_steps - 1, then cosine decay to lr * min_lr_ratio
/// at step total_steps. From cfg.rebase_step on (set when a resume changed the run's length),
/// the cosine starts at cfg.rebase_lr there instead, so the rate goes on without a jump.
double scheduled_lr(const optim_config& cfg, int64_t step, int64_t total_steps);

/// The optimizer of one rank. Its state (moments, step count) covers num_params values in
/// the layout of the model's flat buffer; a rank that owns a shard passes that shard's
/// table (offsets relative to the shard) and size.
class adamw {
 public:
  /// `table` says which ranges get weight decay (param_tensor::decay); ranges not named in
  /// it get none. Throws std::invalid_argument on bad hyper-parameters or a table entry
  /// outside [0, num_params).
  adamw(const optim_config& cfg, const std::vector<param_tensor>& table, size_t num_params);

  /// scheduled_lr with this optimizer's config.
  double learning_rate(int64_t step, int64_t total_steps) const {
    return scheduled_lr(cfg_, step, total_steps);
  }

  /// Scales grads so that their global L2 norm is at most grad_clip (0 = never), with
  /// PyTorch's factor grad_clip / (norm + 1e-6). Returns the norm before clipping
  /// (computed in double). A non-finite norm is returned as is and grads are left alone,
  /// so the caller can skip the step.
  double clip_gradients(float* grads, size_t n) const;

  /// L2 norm of grads, accumulated in double.
  static double grad_norm(const float* grads, size_t n);

  /// The factor clip_gradients applies for a global norm `norm`: grad_clip / (norm + 1e-6)
  /// when clipping is on and norm exceeds grad_clip, else 1. For sharded gradients: sum
  /// grad_norm(shard)^2 over the shards, take the root, and scale every shard by this.
  double clip_scale(double norm) const;
  /// Scales grads (n of them, this rank's shard) by clip_scale(global_norm): the same float
  /// factor on every rank and every shard, as clip_gradients applies it.
  void clip_to_norm(float* grads, size_t n, double global_norm) const;

  /// One update at the learning rate of `step`: t += 1, then for every parameter
  /// p -= lr * (wd * p [decay tensors only] + m_hat / (sqrt(v_hat) + eps)).
  void step(float* params, const float* grads, int64_t step, int64_t total_steps);

  const optim_config& config() const { return cfg_; }
  /// First moments (checkpoint state).
  std::vector<float>& exp_avg() { return m_; }
  const std::vector<float>& exp_avg() const { return m_; }
  /// Second moments (checkpoint state).
  std::vector<float>& exp_avg_sq() { return v_; }
  const std::vector<float>& exp_avg_sq() const { return v_; }
  /// Number of updates applied so far; drives the bias corrections.
  int64_t& t() { return t_; }

  /// Whether `name` matches the comma-separated freeze patterns of optim_config::freeze.
  static bool is_frozen(const std::string& patterns, const std::string& name);

 private:
  /// A run of parameters with one weight-decay setting.
  struct range {
    size_t begin, end;
    bool decay;
    bool frozen = false;
  };

  optim_config cfg_;
  std::vector<range> ranges_;
  std::vector<float> m_;
  std::vector<float> v_;
  int64_t t_ = 0;
};

}  // namespace troupe
