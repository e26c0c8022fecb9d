// AdamW against a hand-written double-precision reference, the learning-rate schedule at
// its corners, and gradient clipping.

#include "runtime/optim/adamw.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace troupe {
namespace {

optim_config plain_config() {
  optim_config c;
  c.lr = 0.1;
  c.beta1 = 0.9;
  c.beta2 = 0.99;
  c.eps = 1e-8;
  c.weight_decay = 0.5;
  c.warmup_steps = 0;
  c.min_lr_ratio = 1.0;  // constant learning rate
  c.grad_clip = 0;
  return c;
}

// Two tensors: a decayed 2-D weight [0, 4) and a bias [4, 6) without decay.
std::vector<param_tensor> two_tensors() {
  return {{"w", {2, 2}, 0, 4, true}, {"b", {2}, 4, 2, false}};
}

TEST(adamw, two_steps_match_the_textbook_update) {
  const optim_config c = plain_config();
  adamw opt(c, two_tensors(), 6);
  std::vector<float> p{1.0f, -2.0f, 0.5f, 3.0f, 0.25f, -1.0f};
  const std::vector<std::vector<float>> grads{{0.5f, 0.1f, -0.2f, 0.0f, 2.0f, -0.3f},
                                              {-0.1f, 0.3f, 0.2f, 1.0f, 1.0f, 0.3f}};
  std::vector<double> ref(p.begin(), p.end()), m(6, 0), v(6, 0);
  for (int t = 1; t <= 2; ++t) {
    opt.step(p.data(), grads[t - 1].data(), t - 1, 100);
    for (int i = 0; i < 6; ++i) {
      const double g = grads[t - 1][i];
      if (i < 4) ref[i] -= c.lr * c.weight_decay * ref[i];  // decoupled, weight only
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * g;
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(c.beta1, t));
      const double v_hat = v[i] / (1 - std::pow(c.beta2, t));
      ref[i] -= c.lr * m_hat / (std::sqrt(v_hat) + c.eps);
    }
    for (int i = 0; i < 6; ++i) EXPECT_NEAR(p[i], ref[i], 1e-6 * (1 + std::abs(ref[i]))) << i;
  }
  EXPECT_EQ(opt.t(), 2);
  // One step by hand: 1 * (1 - 0.1 * 0.5) - 0.1 * g / (|g| + eps) = 0.85 for g = 0.5.
  adamw fresh(c, two_tensors(), 6);
  std::vector<float> q{1.0f, -2.0f, 0.5f, 3.0f, 0.25f, -1.0f};
  fresh.step(q.data(), grads[0].data(), 0, 100);
  EXPECT_NEAR(q[0], 0.85f, 1e-6f);
  EXPECT_NEAR(q[3], 3.0f * 0.95f, 1e-6f);  // zero gradient: only the decay moves it
  EXPECT_NEAR(q[4], 0.25f - 0.1f, 1e-6f);  // bias: no decay
  EXPECT_NEAR(fresh.exp_avg()[4], 0.2f, 1e-7f);
  EXPECT_NEAR(fresh.exp_avg_sq()[4], 0.04f, 1e-7f);
}

TEST(adamw, learning_rate_warms_up_then_follows_the_cosine) {
  optim_config c;
  c.lr = 1.0;
  c.min_lr_ratio = 0.1;
  c.warmup_steps = 10;
  adamw opt(c, {}, 1);
  EXPECT_DOUBLE_EQ(opt.learning_rate(0, 110), 0.1);
  EXPECT_DOUBLE_EQ(opt.learning_rate(4, 110), 0.5);
  EXPECT_DOUBLE_EQ(opt.learning_rate(9, 110), 1.0);
  EXPECT_DOUBLE_EQ(opt.learning_rate(10, 110), 1.0);
  EXPECT_NEAR(opt.learning_rate(60, 110), 0.55, 1e-12);  // halfway down
  EXPECT_NEAR(opt.learning_rate(110, 110), 0.1, 1e-12);
  EXPECT_NEAR(opt.learning_rate(500, 110), 0.1, 1e-12);
  EXPECT_GT(opt.learning_rate(109, 110), 0.1);
  c.warmup_steps = 0;
  adamw no_warmup(c, {}, 1);
  EXPECT_DOUBLE_EQ(no_warmup.learning_rate(0, 100), 1.0);
}

TEST(adamw, clipping_bounds_the_global_norm) {
  optim_config c = plain_config();
  c.grad_clip = 1.0;
  adamw opt(c, {}, 2);
  std::vector<float> g{3.0f, 4.0f};
  EXPECT_DOUBLE_EQ(opt.clip_gradients(g.data(), 2), 5.0);
  EXPECT_LE(adamw::grad_norm(g.data(), 2), 1.0);
  EXPECT_NEAR(adamw::grad_norm(g.data(), 2), 1.0, 1e-6);
  EXPECT_NEAR(g[0] / g[1], 0.75, 1e-6);  // direction kept

  std::vector<float> small{0.3f, 0.4f};
  EXPECT_NEAR(opt.clip_gradients(small.data(), 2), 0.5, 1e-7);
  EXPECT_EQ(small[0], 0.3f);  // below the bound: untouched

  c.grad_clip = 0;
  adamw off(c, {}, 2);
  std::vector<float> big{30.0f, 40.0f};
  EXPECT_NEAR(off.clip_gradients(big.data(), 2), 50.0, 1e-9);
  EXPECT_EQ(big[0], 30.0f);

  EXPECT_DOUBLE_EQ(opt.clip_scale(5.0), 1.0 / (5.0 + 1e-6));
  EXPECT_EQ(opt.clip_scale(0.5), 1.0);

  std::vector<float> bad{1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_TRUE(std::isnan(opt.clip_gradients(bad.data(), 2)));
  EXPECT_EQ(bad[0], 1.0f);
}

TEST(adamw, rejects_bad_settings) {
  optim_config c = plain_config();
  c.beta1 = 1.0;
  EXPECT_THROW(adamw(c, {}, 1), std::invalid_argument);
  EXPECT_THROW(adamw(plain_config(), two_tensors(), 5), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
