#include "strategies/zero.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace troupe::strategies {

zero_shard zero_shard_of(size_t num_params, int dp_rank, int dp_size, size_t align) {
  zero_shard s;
  const auto dp = static_cast<size_t>(dp_size);
  align = std::max<size_t>(1, align);
  s.block = ((num_params + dp - 1) / dp + align - 1) / align * align;
  s.offset = std::min(num_params, static_cast<size_t>(dp_rank) * s.block);
  s.count = std::min(num_params, s.offset + s.block) - s.offset;
  return s;
}

std::vector<param_tensor> shard_table(const std::vector<param_tensor>& full_table,
                                      const zero_shard& shard) {
  std::vector<param_tensor> out;
  const size_t lo = shard.offset, hi = shard.offset + shard.count;
  for (const auto& t : full_table) {
    size_t begin = std::max(lo, t.offset), end = std::min(hi, t.offset + t.numel);
    if (begin >= end) continue;
    param_tensor part = t;
    part.offset = begin - lo;
    part.numel = end - begin;
    part.shape = {static_cast<int64_t>(part.numel)};
    out.push_back(std::move(part));
  }
  return out;
}

zero1_optimizer::zero1_optimizer(const optim_config& cfg, const std::vector<param_tensor>& table,
                                 size_t num_params, int dp_rank, int dp_size, zero_options options)
    : num_params_(num_params),
      dp_size_(dp_size),
      options_(options),
      shard_(zero_shard_of(num_params, dp_rank, dp_size, options.align)),
      adam_(cfg, shard_table(table, shard_), shard_.count),
      padded_(shard_.block * static_cast<size_t>(dp_size), 0.0f),
      grad_shard_(shard_.block, 0.0f),
      param_shard_(shard_.block, 0.0f) {}

void zero1_optimizer::reduce_gradients(comm::communicator& dp, const float* grads,
                                       const comm::op_options& opts) {
  if (dp_size_ == 1) {
    std::memcpy(grad_shard_.data(), grads, num_params_ * sizeof(float));
    return;
  }
  // The tail past num_params stays zero from construction: padding adds nothing.
  std::memcpy(padded_.data(), grads, num_params_ * sizeof(float));
  dp.reduce_scatter(padded_.data(), grad_shard_.data(), shard_.block, comm::reduce_op::sum, opts);
}

double zero1_optimizer::apply(comm::communicator& dp, float* params, int64_t step,
                              int64_t total_steps, const comm::op_options& opts) {
  auto over_dp = [&](const float* g, const zero_shard& shard) {
    double local_sq = 0;
    for (size_t i = 0; i < shard.count; ++i) local_sq += static_cast<double>(g[i]) * g[i];
    // The global norm is a sum over shards; all-reduce it as a float pair split in a high
    // and a low part so the sum keeps nearly double precision.
    float parts[2] = {static_cast<float>(local_sq),
                      static_cast<float>(local_sq - static_cast<float>(local_sq))};
    if (dp_size_ > 1) dp.all_reduce(parts, 2, comm::reduce_op::sum, opts);
    return std::sqrt(static_cast<double>(parts[0]) + static_cast<double>(parts[1]));
  };
  return apply(dp, params, step, total_steps, opts, over_dp);
}

double zero1_optimizer::apply(comm::communicator& dp, float* params, int64_t step,
                              int64_t total_steps, const comm::op_options& opts,
                              const norm_fn& global_norm) {
  float* g = grad_shard_.data();
  const double norm = global_norm(g, shard_);
  if (!std::isfinite(norm)) return norm;  // leave parameters alone; the caller decides
  const double scale = adam_.clip_scale(norm);
  if (scale != 1.0 && options_.float_clip) {
    adam_.clip_to_norm(g, shard_.count, norm);  // the replicated optimizer's float factor
  } else if (scale != 1.0) {
    for (size_t i = 0; i < shard_.count; ++i) g[i] = static_cast<float>(g[i] * scale);
  }

  std::memcpy(param_shard_.data(), params + shard_.offset, shard_.count * sizeof(float));
  adam_.step(param_shard_.data(), g, step, total_steps);
  if (dp_size_ == 1) {
    std::memcpy(params, param_shard_.data(), num_params_ * sizeof(float));
    return norm;
  }
  dp.all_gather(param_shard_.data(), padded_.data(), shard_.block * sizeof(float), opts);
  std::memcpy(params, padded_.data(), num_params_ * sizeof(float));
  std::fill(padded_.begin() + static_cast<std::ptrdiff_t>(num_params_), padded_.end(), 0.0f);
  return norm;
}

size_t zero1_optimizer::state_bytes() const {
  return (adam_.exp_avg().capacity() + adam_.exp_avg_sq().capacity()) * sizeof(float);
}

}  // namespace troupe::strategies
