// The whole model: its backward against finite differences (double precision, every
// coordinate), the float model against the double one, and its bookkeeping.

#include "runtime/model/gpt.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include "tests/runtime/gradcheck.hpp"

namespace troupe {
namespace {

using testing::gradcheck;
using testing::gradcheck_tolerance;

model_config tiny_config() {
  model_config m;
  m.n_layer = 2;
  m.n_head = 2;
  m.d_model = 8;
  m.context = 6;
  m.vocab = 256;
  return m;
}

/// A micro-batch of B sequences of T bytes with some repeated tokens.
struct batch {
  int B, T;
  std::vector<token_id> inputs, targets;
  batch(int b, int t, unsigned seed) : B(b), T(t), inputs(b * t), targets(b * t) {
    for (int i = 0; i < b * t; ++i) {
      inputs[i] = static_cast<token_id>((seed * 131 + i * 37) % 11 + 97);
      targets[i] = static_cast<token_id>((seed * 71 + i * 53) % 13 + 97);
    }
  }
};

// Method: basic_gpt<double> (the same template code as the float model) on a tiny config;
// the gradient of grad_scale * mean loss is compared with fourth-order central differences
// of grad_scale * forward_loss on EVERY parameter (~3,900), relative error < 1e-6. T is
// shorter than the context, so unused position rows must get exactly zero gradient.
TEST(gpt, backward_matches_finite_differences_in_double) {
  basic_gpt<double> m(tiny_config());
  m.init_params(7);
  // Noise on every parameter, so biases and LayerNorm are away from their 0 and 1 too.
  const std::vector<double> noise = testing::random_vector(m.num_params(), 3, 0.1);
  for (size_t i = 0; i < m.num_params(); ++i) m.params()[i] += noise[i];
  const batch b(2, 5, 1);
  const double scale = 0.5;
  m.zero_grads();
  m.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, static_cast<float>(scale));
  const std::vector<double> analytic(m.grads(), m.grads() + m.num_params());
  auto f = [&] { return scale * m.forward_loss(b.inputs.data(), b.targets.data(), b.B, b.T); };
  const double err = gradcheck(f, m.params(), analytic.data(), m.num_params());
  EXPECT_LT(err, gradcheck_tolerance);

  // The check can fail: one coordinate of the attention projection off by 2% is caught.
  std::vector<double> wrong = analytic;
  const param_tensor& qkv = m.tensor("h.1.attn.qkv.weight");
  size_t big = qkv.offset;
  for (size_t i = qkv.offset; i < qkv.offset + qkv.numel; ++i) {
    if (std::abs(wrong[i]) > std::abs(wrong[big])) big = i;
  }
  wrong[big] *= 1.02;
  EXPECT_GT(gradcheck(f, m.params(), wrong.data(), m.num_params(), {big}), 1e-3);
}

// The float model that trains, against the double model on identical (float-rounded)
// parameters: loss to 1e-6 relative, gradients to 1e-4 relative in L2 norm and per
// tensor (float rounding through ~20 layers of sums, softmaxes and normalisations).
TEST(gpt, float_model_matches_double_model) {
  model_config cfg = tiny_config();
  cfg.d_model = 16;
  cfg.context = 12;  // attention rows long enough for the vector softmax path
  gpt mf(cfg);
  mf.init_params(3);
  basic_gpt<double> md(cfg);
  for (size_t i = 0; i < mf.num_params(); ++i) md.params()[i] = mf.params()[i];
  const batch b(3, 12, 2);
  mf.zero_grads();
  md.zero_grads();
  const double lf = mf.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, 1.0f);
  const double ld = md.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, 1.0f);
  EXPECT_NEAR(lf, ld, 1e-6 * ld);
  for (const param_tensor& t : mf.param_table()) {
    double num = 0, den = 0;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      const double d = md.grads()[i];
      num += (mf.grads()[i] - d) * (mf.grads()[i] - d);
      den += d * d;
    }
    if (den == 0) {
      EXPECT_EQ(num, 0) << t.name;
      continue;
    }
    EXPECT_LT(std::sqrt(num / den), 1e-4) << t.name;
  }
}

TEST(gpt, initial_loss_is_about_log_vocab) {
  gpt m(model_config{});
  m.init_params(1337);
  const batch b(4, 64, 3);
  const double loss = m.forward_loss(b.inputs.data(), b.targets.data(), b.B, b.T);
  EXPECT_NEAR(loss, std::log(256.0), 0.1);
}

TEST(gpt, param_table_is_contiguous_and_named) {
  const model_config cfg{};
  gpt m(cfg);
  const int64_t C = cfg.d_model;
  size_t at = 0;
  std::set<std::string> names;
  for (const param_tensor& t : m.param_table()) {
    EXPECT_EQ(t.offset, at) << t.name;
    size_t numel = 1;
    for (int64_t s : t.shape) numel *= static_cast<size_t>(s);
    EXPECT_EQ(t.numel, numel) << t.name;
    EXPECT_EQ(t.decay, t.shape.size() == 2) << t.name;
    EXPECT_TRUE(names.insert(t.name).second) << "duplicate " << t.name;
    at += t.numel;
  }
  EXPECT_EQ(at, m.num_params());
  const size_t expected = 256 * C + cfg.context * C + 2 * C + cfg.n_layer * (12 * C * C + 13 * C);
  EXPECT_EQ(m.num_params(), expected);
  EXPECT_EQ(m.tensor("h.3.mlp.proj.weight").shape, (std::vector<int64_t>{C, 4 * C}));
  EXPECT_THROW(m.tensor("nope"), std::out_of_range);
}

TEST(gpt, init_is_deterministic_and_gpt2_shaped) {
  const model_config cfg{};
  gpt a(cfg), b(cfg), c(cfg);
  a.init_params(42);
  b.init_params(42);
  c.init_params(43);
  EXPECT_EQ(std::memcmp(a.params(), b.params(), a.num_params() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(a.params(), c.params(), a.num_params() * sizeof(float)), 0);
  auto stddev = [&](const std::string& name) {
    const param_tensor& t = a.tensor(name);
    double s = 0;
    for (size_t i = 0; i < t.numel; ++i)
      s += double(a.params()[t.offset + i]) * a.params()[t.offset + i];
    return std::sqrt(s / t.numel);
  };
  EXPECT_NEAR(stddev("h.0.mlp.fc.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("h.0.mlp.proj.weight"), 0.02 / std::sqrt(2.0 * cfg.n_layer), 0.001);
  EXPECT_NEAR(stddev("h.2.attn.proj.weight"), 0.02 / std::sqrt(2.0 * cfg.n_layer), 0.001);
  EXPECT_EQ(a.params()[a.tensor("ln_f.weight").offset], 1.0f);
  EXPECT_EQ(a.params()[a.tensor("ln_f.bias").offset], 0.0f);
  EXPECT_EQ(a.params()[a.tensor("h.1.attn.qkv.bias").offset], 0.0f);
}

TEST(gpt, same_inputs_give_bit_identical_losses_and_gradients) {
  model_config cfg = tiny_config();
  gpt a(cfg), b(cfg);
  a.init_params(5);
  b.init_params(5);
  const batch x(2, 6, 4);
  a.zero_grads();
  b.zero_grads();
  const double la = a.forward_backward(x.inputs.data(), x.targets.data(), 2, 6, 1.0f);
  const double lb = b.forward_backward(x.inputs.data(), x.targets.data(), 2, 6, 1.0f);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(std::memcmp(a.grads(), b.grads(), a.num_params() * sizeof(float)), 0);
}

TEST(gpt, gradients_accumulate_and_scale) {
  gpt m(tiny_config());
  m.init_params(9);
  const batch x(2, 6, 5);
  m.zero_grads();
  const double loss = m.forward_backward(x.inputs.data(), x.targets.data(), 2, 6, 1.0f);
  const std::vector<float> once(m.grads(), m.grads() + m.num_params());
  m.forward_backward(x.inputs.data(), x.targets.data(), 2, 6, 2.0f);
  for (size_t i = 0; i < once.size(); ++i) {
    EXPECT_NEAR(m.grads()[i], 3 * once[i], 1e-6f + 1e-5f * std::abs(once[i]));
  }
  const std::vector<float> grads(m.grads(), m.grads() + m.num_params());
  EXPECT_EQ(m.forward_loss(x.inputs.data(), x.targets.data(), 2, 6), loss);
  EXPECT_EQ(std::memcmp(grads.data(), m.grads(), grads.size() * sizeof(float)), 0);
}

TEST(gpt, micro_batch_size_changes_reuse_buffers_correctly) {
  // A batch of 3 after a batch of 1 (buffers grow), then 1 again (they are reused).
  gpt m(tiny_config());
  m.init_params(11);
  const batch one(1, 6, 6), three(3, 6, 7);
  const double l1 = m.forward_loss(one.inputs.data(), one.targets.data(), 1, 6);
  const double l3 = m.forward_loss(three.inputs.data(), three.targets.data(), 3, 6);
  EXPECT_EQ(m.forward_loss(one.inputs.data(), one.targets.data(), 1, 6), l1);
  // Sequences are independent: the batch's mean is the mean of per-sequence losses.
  double sum = 0;
  for (int s = 0; s < 3; ++s) {
    sum += m.forward_loss(three.inputs.data() + 6 * s, three.targets.data() + 6 * s, 1, 6);
  }
  EXPECT_NEAR(l3, sum / 3, 1e-6);
}

TEST(gpt, rejects_bad_shapes) {
  model_config bad = tiny_config();
  bad.n_head = 3;
  EXPECT_THROW(gpt{bad}, std::invalid_argument);
  bad = tiny_config();
  bad.vocab = 1;  // the data's vocabulary is checked where the data is opened
  EXPECT_THROW(gpt{bad}, std::invalid_argument);
  gpt m(tiny_config());
  const batch x(1, 7, 1);
  EXPECT_THROW(m.forward_loss(x.inputs.data(), x.targets.data(), 1, 7), std::invalid_argument);
}

// An aborted generation's pass stops between blocks; the parameters are never touched by
// it, and lowering the flag lets the same model train on, bit-identically.
TEST(gpt, raised_interrupt_stops_a_pass_and_leaves_the_parameters) {
  gpt m(tiny_config());
  m.init_params(3);
  const std::vector<float> before(m.params(), m.params() + m.num_params());
  std::atomic<bool> stop{true};
  m.set_interrupt(&stop);
  const batch b(2, 5, 1);
  m.zero_grads();
  EXPECT_THROW(m.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, 1.0f),
               compute_interrupted);
  EXPECT_THROW(m.forward_loss(b.inputs.data(), b.targets.data(), b.B, b.T), compute_interrupted);
  EXPECT_EQ(std::memcmp(before.data(), m.params(), before.size() * sizeof(float)), 0);

  stop = false;
  gpt alone(tiny_config());
  alone.init_params(3);
  m.zero_grads();
  alone.zero_grads();
  EXPECT_EQ(m.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, 1.0f),
            alone.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, 1.0f));
  EXPECT_EQ(std::memcmp(m.grads(), alone.grads(), m.num_params() * sizeof(float)), 0);
}

}  // namespace
}  // namespace troupe
