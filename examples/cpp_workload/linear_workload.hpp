#pragma once
// A workload of a user's own (docs/WORKLOAD.md): linear regression on a synthetic dataset,
// trained with SGD and momentum. It declares its state as named tensors, computes a step on
// the samples troupe's sampler gives its share of the global batch, exposes its gradient as one
// bucket for the runtime to sum over the data-parallel group, and changes its state only in
// apply(), after the step committed. Data parallelism only (layout_support::data_parallel).

#include <array>
#include <cmath>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "runtime/data/random.hpp"
#include "runtime/data/sampler.hpp"
#include "runtime/workload/workload.hpp"

namespace linear {

constexpr int features = 16;
constexpr int64_t samples = 4096;

// Sample i of the dataset: x from a fixed normal stream, y = x . w_true + 0.5 + noise.
inline void sample(uint64_t seed, int64_t i, std::array<float, features>& x, float& y) {
  double dot = 0.5;
  for (int f = 0; f < features; ++f) {
    x[static_cast<size_t>(f)] =
        static_cast<float>(troupe::normal_at(seed, 1, static_cast<uint64_t>(i * features + f)));
    dot += (f % 3 - 1) * 0.25 * x[static_cast<size_t>(f)];
  }
  y = static_cast<float>(dot + 0.01 * troupe::normal_at(seed, 2, static_cast<uint64_t>(i)));
}

class generation final : public troupe::workload_generation {
 public:
  generation(const troupe::generation_env& env, const troupe::job_settings& job)
      : env_(env), job_(job), sampler_(job.seed, samples, job.global_batch) {}

  troupe::state_view state() override {
    troupe::state_view v;
    const std::array<troupe::tensor_decl, 2> model = {
        troupe::tensor_decl{"model/weight", "model", {features}},
        troupe::tensor_decl{"model/bias", "model", {}}};
    const std::array<troupe::tensor_decl, 2> optim = {
        troupe::tensor_decl{"optim/weight.momentum",
                            "optim",
                            {features},
                            troupe::dtype::f32,
                            troupe::tensor_role::optimizer},
        troupe::tensor_decl{"optim/bias.momentum",
                            "optim",
                            {},
                            troupe::dtype::f32,
                            troupe::tensor_role::optimizer}};
    float* at[] = {weight_.data(), &bias_, momentum_.data(), &bias_momentum_};
    size_t i = 0;
    for (const auto& list : {model, optim})
      for (const auto& t : list) {
        v.tensors.push_back(t);
        v.regions.push_back(troupe::replicated_region(
            t, std::as_writable_bytes(std::span<float>(at[i++], t.numel())), env_.dp.size,
            env_.dp.index));
      }
    return v;
  }

  void init(uint64_t) override {
    weight_.fill(0);
    bias_ = 0;
    momentum_.fill(0);
    bias_momentum_ = 0;
  }

  // Mean squared error over the global batch: this share's gradient is scaled by 1 / G so
  // that the sum over replicas is the global batch's.
  troupe::step_outcome compute(const troupe::step_work& work) override {
    grad_.fill(0);
    troupe::step_outcome out;
    std::array<float, features> x{};
    float y = 0;
    const double scale = 1.0 / work.global_batch;
    for (int64_t i : sampler_.indices(work.data_position, env_.share)) {
      sample(job_.seed, i, x, y);
      double pred = bias_;
      for (int f = 0; f < features; ++f)
        pred += weight_[static_cast<size_t>(f)] * x[static_cast<size_t>(f)];
      const double err = pred - y;
      out.loss_sum += 0.5 * err * err;
      ++out.count;
      for (int f = 0; f < features; ++f)
        grad_[static_cast<size_t>(f)] +=
            static_cast<float>(err * x[static_cast<size_t>(f)] * scale);
      grad_[features] += static_cast<float>(err * scale);
    }
    if (work.sink) work.sink->ready(0);  // the one bucket is final
    return out;
  }

  std::vector<troupe::gradient_bucket> gradient_buckets() override {
    return {troupe::gradient_bucket{std::span<float>(grad_)}};
  }

  void apply(const troupe::apply_env&) override {
    for (int f = 0; f < features; ++f) {
      auto& m = momentum_[static_cast<size_t>(f)];
      m = 0.9f * m + grad_[static_cast<size_t>(f)];
      weight_[static_cast<size_t>(f)] -= lr * m;
    }
    bias_momentum_ = 0.9f * bias_momentum_ + grad_[features];
    bias_ -= lr * bias_momentum_;
  }
  double learning_rate(int64_t) const override { return lr; }
  void abort() noexcept override {}

 private:
  static constexpr float lr = 0.05f;
  troupe::generation_env env_;
  troupe::job_settings job_;
  troupe::sampler sampler_;
  std::array<float, features> weight_{}, momentum_{};
  float bias_ = 0, bias_momentum_ = 0;
  std::array<float, features + 1> grad_{};
};

class workload final : public troupe::workload {
 public:
  explicit workload(troupe::job_settings job) : job_(std::move(job)) {}
  troupe::workload_traits traits() const override {
    troupe::workload_traits t;
    t.name = "linear regression";
    return t;  // data parallel, reduced by the runtime, samples
  }
  std::unique_ptr<troupe::workload_generation> make_generation(
      const troupe::generation_env& env) override {
    return std::make_unique<generation>(env, job_);
  }

 private:
  troupe::job_settings job_;
};

}  // namespace linear
