// The Mixture-of-Experts MLP alone and inside the GPT: backward against finite differences
// (double precision), capacity dropping, the aux loss on a hand-computed example, and the
// MoE model's bookkeeping.

#include "runtime/model/moe.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "runtime/model/gpt.hpp"
#include "runtime/model/layers.hpp"
#include "tests/runtime/gradcheck.hpp"

namespace troupe {
namespace {

using testing::dot;
using testing::gradcheck;
using testing::gradcheck_tolerance;
using testing::random_vector;

/// The smallest gap, over tokens, between neighbouring router probabilities among the top
/// k + 1 (sorted descending). Top-k selection and the first choice (which the aux loss
/// counts) cannot change under a perturbation that moves every probability by less than
/// half of it, so the loss is smooth there and finite differences are valid.
template <typename F>
double routing_margin(const std::vector<F>& probs, int N, int E, int K) {
  double margin = 1e9;
  for (int t = 0; t < N; ++t) {
    std::vector<double> p(probs.begin() + static_cast<ptrdiff_t>(t) * E,
                          probs.begin() + static_cast<ptrdiff_t>(t + 1) * E);
    std::sort(p.rbegin(), p.rend());
    for (int j = 0; j < K && j + 1 < E; ++j) margin = std::min(margin, p[j] - p[j + 1]);
  }
  return margin;
}

struct layer_case {
  int top_k;
  double capacity_factor;
};

std::string case_name(const ::testing::TestParamInfo<layer_case>& p) {
  return "top" + std::to_string(p.param.top_k) +
         (p.param.capacity_factor < 1 ? "_drops" : "_no_drops");
}

class moe_layer_gradient : public ::testing::TestWithParam<layer_case> {};

// Method: the objective sum(out * R) + c * aux of one layer in double, against fourth-order
// central differences (h = 1e-4) on every input, router and expert coordinate. Inputs and
// router weights are scaled so the router probabilities are well separated: the test first
// asserts that the routing margin exceeds 1e-3, while a coordinate step of 2h moves any
// probability by well under 1e-4, so no choice, and hence no capacity drop, flips inside
// the stencil. capacity_factor 0.5 drops choices; 4 drops none.
TEST_P(moe_layer_gradient, backward_matches_finite_differences) {
  const layer_case lc = GetParam();
  const int C = 6, E = 4, N = 10;
  const moe::moe_config cfg{C, E, lc.top_k, lc.capacity_factor};
  moe::moe_layer<double> layer(cfg, nullptr);
  std::vector<double> x = random_vector(static_cast<size_t>(N) * C, 11, 1.0);
  std::vector<double> router = random_vector(static_cast<size_t>(E) * C, 12, 0.8);
  std::vector<double> experts = random_vector(E * moe::expert_param_count(C), 13, 0.3);
  const std::vector<double> R = random_vector(static_cast<size_t>(N) * C, 14, 1.0);
  const double c = 0.7;
  std::vector<double> out(static_cast<size_t>(N) * C);

  auto objective = [&] {
    const double aux = layer.forward(out.data(), x.data(), N, router.data(), experts.data());
    return dot(out, R) + c * aux;
  };
  objective();
  const double margin = routing_margin(layer.router_probs(), N, E, lc.top_k);
  ASSERT_GT(margin, 1e-3) << "routing too close to a tie for finite differences";
  if (lc.capacity_factor < 1) {
    EXPECT_GT(layer.dropped_tokens(), 0);
  } else {
    EXPECT_EQ(layer.dropped_tokens(), 0);
  }

  std::vector<double> dx(x.size(), 0.0), drouter(router.size(), 0.0), dexperts(experts.size(), 0.0);
  layer.backward(dx.data(), drouter.data(), dexperts.data(), R.data(), x.data(), router.data(),
                 experts.data(), c);
  EXPECT_LT(gradcheck(objective, x.data(), dx.data(), x.size()), gradcheck_tolerance);
  EXPECT_LT(gradcheck(objective, router.data(), drouter.data(), router.size()),
            gradcheck_tolerance);
  EXPECT_LT(gradcheck(objective, experts.data(), dexperts.data(), experts.size()),
            gradcheck_tolerance);

  // The check can fail: a router gradient off by 2% is caught.
  std::vector<double> wrong = drouter;
  const auto big = static_cast<size_t>(
      std::max_element(wrong.begin(), wrong.end(),
                       [](double a, double b) { return std::abs(a) < std::abs(b); }) -
      wrong.begin());
  wrong[big] *= 1.02;
  EXPECT_GT(gradcheck(objective, router.data(), wrong.data(), router.size(), {big}), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(moe, moe_layer_gradient,
                         ::testing::Values(layer_case{1, 4.0}, layer_case{1, 0.5},
                                           layer_case{2, 4.0}, layer_case{2, 0.5}),
                         case_name);

/// One expert's MLP on one row, written out with the layer functions.
std::vector<double> expert_mlp(const double* params, const double* x, int C) {
  const size_t c = static_cast<size_t>(C);
  std::vector<double> h(4 * c), g(4 * c), y(c);
  layers::linear_forward(h.data(), x, params, params + 4 * c * c, 1, C, 4 * C);
  layers::gelu_forward(g.data(), h.data(), 4 * c);
  const double* proj = params + 4 * c * c + 4 * c;
  layers::linear_forward(y.data(), g.data(), proj, proj + 4 * c * c, 1, 4 * C, C);
  return y;
}

// Two experts, C = 2, router = identity: a token (1,0) prefers expert 0 and (0,1) expert
// 1. Five of six tokens pick expert 0; capacity = ceil(1.0 * 6 * 1 / 2) = 3, so the 4th
// and 5th of them (tokens 4 and 5, in token order) are dropped and get zero output.
TEST(moe, capacity_drops_the_latest_tokens_in_token_order) {
  const int C = 2, E = 2, N = 6;
  moe::moe_layer<double> layer({C, E, 1, 1.0}, nullptr);
  const std::vector<double> router = {1, 0, 0, 1};
  const std::vector<double> x = {1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 1, 0};
  const std::vector<double> experts = random_vector(E * moe::expert_param_count(C), 5, 0.5);
  std::vector<double> out(static_cast<size_t>(N) * C);
  layer.forward(out.data(), x.data(), N, router.data(), experts.data());

  EXPECT_EQ(layer.capacity(), 3);
  EXPECT_EQ(layer.tokens_per_expert(), (std::vector<int64_t>{5, 1}));
  EXPECT_EQ(layer.dropped_tokens(), 2);
  EXPECT_EQ(layer.kept(), (std::vector<bool>{true, true, true, true, false, false}));
  const double p_hi = std::exp(1.0) / (std::exp(1.0) + 1);  // softmax(1, 0)[0]
  for (int t = 0; t < N; ++t) {
    const int e = x[2 * t] == 1 ? 0 : 1;
    std::vector<double> want(C, 0.0);
    if (t < 4) {
      const std::vector<double> y =
          expert_mlp(experts.data() + e * moe::expert_param_count(C), x.data() + 2 * t, C);
      for (int c = 0; c < C; ++c) want[c] = p_hi * y[c];
    }
    for (int c = 0; c < C; ++c) EXPECT_NEAR(out[2 * t + c], want[c], 1e-12) << t << "," << c;
  }
  // With capacity for all (factor 2: ceil(6) = 6) nothing is dropped.
  moe::moe_layer<double> roomy({C, E, 1, 2.0}, nullptr);
  roomy.forward(out.data(), x.data(), N, router.data(), experts.data());
  EXPECT_EQ(roomy.dropped_tokens(), 0);
  EXPECT_NE(out[10], 0.0);
}

// The same six tokens: aux = E * sum_e f_e P_e by hand. f = (5/6, 1/6) from the first
// choices; with a = e/(e+1) and b = 1/(e+1), P_0 = (5a + b)/6 and P_1 = (5b + a)/6.
TEST(moe, aux_loss_matches_hand_computation) {
  const int C = 2, E = 2, N = 6;
  const std::vector<double> router = {1, 0, 0, 1};
  const std::vector<double> x = {1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 1, 0};
  const std::vector<double> experts(E * moe::expert_param_count(C), 0.1);
  std::vector<double> out(static_cast<size_t>(N) * C);
  const double a = std::exp(1.0) / (std::exp(1.0) + 1), b = 1 / (std::exp(1.0) + 1);
  const double want = 2 * (5.0 / 6 * (5 * a + b) / 6 + 1.0 / 6 * (5 * b + a) / 6);
  for (int k : {1, 2}) {
    moe::moe_layer<double> layer({C, E, k, 1.25}, nullptr);
    // top_k = 2 still counts only first choices in f_e.
    EXPECT_NEAR(layer.forward(out.data(), x.data(), N, router.data(), experts.data()), want, 1e-14)
        << "top_k " << k;
    EXPECT_EQ(layer.aux_loss(),
              layer.forward(out.data(), x.data(), N, router.data(), experts.data()));
  }
  // Perfect balance gives the minimum, 1: uniform router probabilities, even first choices.
  moe::moe_layer<double> even({C, E, 1, 1.25}, nullptr);
  const std::vector<double> x2 = {1, 0, 0, 1};
  const std::vector<double> zero_router(4, 0.0);
  EXPECT_NEAR(even.forward(out.data(), x2.data(), 2, zero_router.data(), experts.data()), 1.0,
              1e-15);
}

// Top-2 gates are the two probabilities renormalised; both choices count against capacity
// (capacity = ceil(1.0 * 4 * 2 / 3) = 3 per expert).
TEST(moe, top2_renormalises_gates_and_counts_both_choices) {
  const int C = 3, E = 3, N = 4;
  moe::moe_layer<double> layer({C, E, 2, 1.0}, nullptr);
  const std::vector<double> router = {3, 0, 0, 0, 2, 0, 0, 0, 1};
  const std::vector<double> x = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};  // all pick 0 then 1
  const std::vector<double> experts = random_vector(E * moe::expert_param_count(C), 8, 0.5);
  std::vector<double> out(static_cast<size_t>(N) * C);
  layer.forward(out.data(), x.data(), N, router.data(), experts.data());
  EXPECT_EQ(layer.capacity(), 3);
  EXPECT_EQ(layer.tokens_per_expert(), (std::vector<int64_t>{4, 4, 0}));
  EXPECT_EQ(layer.dropped_tokens(), 2);
  EXPECT_EQ(layer.kept(), (std::vector<bool>{true, true, true, true, true, true, false, false}));
  const double g0 = std::exp(3.0) / (std::exp(3.0) + std::exp(2.0));
  const std::vector<double> y0 = expert_mlp(experts.data(), x.data(), C);
  const std::vector<double> y1 =
      expert_mlp(experts.data() + moe::expert_param_count(C), x.data(), C);
  for (int c = 0; c < C; ++c) {
    EXPECT_NEAR(out[c], g0 * y0[c] + (1 - g0) * y1[c], 1e-12);
    EXPECT_NEAR(out[9 + c], 0.0, 1e-15);  // token 3: both choices beyond capacity
  }
}

TEST(moe, rejects_bad_shapes) {
  EXPECT_THROW(moe::moe_layer<float>({4, 2, 3, 1.0}, nullptr), std::invalid_argument);
  EXPECT_THROW(moe::moe_layer<float>({4, 1, 2, 1.0}, nullptr), std::invalid_argument);
  EXPECT_THROW(moe::moe_layer<float>({4, 2, 1, 0.0}, nullptr), std::invalid_argument);
}

// ------------------------------------------------------------------ inside the GPT

model_config moe_config(int top_k, double capacity_factor) {
  model_config m;
  m.n_layer = 2;
  m.n_head = 2;
  m.d_model = 8;
  m.context = 6;
  m.vocab = 256;
  m.experts = 4;
  m.top_k = top_k;
  m.capacity_factor = capacity_factor;
  m.aux_loss_coef = 0.3;  // large, so a wrong aux gradient would show
  return m;
}

struct batch {
  std::vector<token_id> inputs, targets;
  batch(int n, unsigned seed) : inputs(n), targets(n) {
    for (int i = 0; i < n; ++i) {
      inputs[i] = static_cast<token_id>((seed * 131 + i * 37) % 11 + 97);
      targets[i] = static_cast<token_id>((seed * 71 + i * 53) % 13 + 97);
    }
  }
};

/// GPT-2 init plus noise, with the routers scaled up so routing is decisive.
void init_for_gradcheck(basic_gpt<double>& m, uint64_t seed) {
  m.init_params(seed);
  const std::vector<double> noise = random_vector(m.num_params(), 3, 0.1);
  for (size_t i = 0; i < m.num_params(); ++i) m.params()[i] += noise[i];
  for (const param_tensor& t : m.param_table()) {
    if (!t.name.ends_with("moe.router.weight")) continue;
    for (size_t i = 0; i < t.numel; ++i) m.params()[t.offset + i] *= 8;
  }
}

class moe_gpt_gradient : public ::testing::TestWithParam<layer_case> {};

// Method: as gpt.backward_matches_finite_differences_in_double, on every parameter of a
// 2-block MoE GPT (4 experts), loss = LM + 0.3 * aux. The routing margin of every block is
// asserted above 1e-3 first (see routing_margin); capacity_factor 0.5 drops choices.
TEST_P(moe_gpt_gradient, backward_matches_finite_differences_in_double) {
  const layer_case lc = GetParam();
  basic_gpt<double> m(moe_config(lc.top_k, lc.capacity_factor));
  init_for_gradcheck(m, 7);
  const int B = 2, T = 5;
  const batch b(B * T, 1);
  const double scale = 0.5;
  m.zero_grads();
  m.forward_backward(b.inputs.data(), b.targets.data(), B, T, static_cast<float>(scale));
  int64_t dropped = 0;
  for (int l = 0; l < 2; ++l) {
    ASSERT_GT(routing_margin(m.moe_layer(l).router_probs(), B * T, 4, lc.top_k), 1e-3) << l;
    dropped += m.moe_layer(l).dropped_tokens();
  }
  if (lc.capacity_factor < 1) {
    EXPECT_GT(dropped, 0);
  }
  EXPECT_GT(m.last_aux_loss(), 0);
  const std::vector<double> analytic(m.grads(), m.grads() + m.num_params());
  auto f = [&] { return scale * m.forward_loss(b.inputs.data(), b.targets.data(), B, T); };
  EXPECT_LT(gradcheck(f, m.params(), analytic.data(), m.num_params()), gradcheck_tolerance);
}

INSTANTIATE_TEST_SUITE_P(moe, moe_gpt_gradient,
                         ::testing::Values(layer_case{1, 4.0}, layer_case{1, 0.5},
                                           layer_case{2, 4.0}, layer_case{2, 0.5}),
                         case_name);

TEST(moe_gpt, param_table_names_experts_and_drops_the_dense_mlp) {
  const model_config cfg = moe_config(1, 1.25);
  gpt m(cfg);
  const int64_t C = cfg.d_model;
  EXPECT_EQ(m.tensor("h.0.moe.router.weight").shape, (std::vector<int64_t>{4, C}));
  EXPECT_EQ(m.tensor("h.1.moe.experts.3.fc.weight").shape, (std::vector<int64_t>{4 * C, C}));
  EXPECT_EQ(m.tensor("h.1.moe.experts.3.proj.bias").shape, (std::vector<int64_t>{C}));
  EXPECT_THROW(m.tensor("h.0.mlp.fc.weight"), std::out_of_range);
  size_t at = 0;
  for (const param_tensor& t : m.param_table()) {
    EXPECT_EQ(t.offset, at) << t.name;
    at += t.numel;
  }
  const size_t block = 12 * C * C + 13 * C - (8 * C * C + 5 * C) + 4 * C +
                       4 * moe::expert_param_count(static_cast<int>(C));
  EXPECT_EQ(m.num_params(), 256 * C + cfg.context * C + 2 * C + cfg.n_layer * block);
}

TEST(moe_gpt, loss_is_lm_plus_scaled_aux_and_counts_are_exposed) {
  const model_config cfg = moe_config(2, 1.0);
  gpt m(cfg);
  m.init_params(3);
  const batch b(12, 2);
  const double loss = m.forward_loss(b.inputs.data(), b.targets.data(), 2, 6);
  EXPECT_NEAR(loss, m.last_lm_loss() + cfg.aux_loss_coef * m.last_aux_loss(), 1e-12);
  EXPECT_NEAR(m.last_lm_loss(), std::log(256.0), 0.1);
  // Near-uniform routing at init: each block's aux is close to its minimum of 1.
  EXPECT_NEAR(m.last_aux_loss(), 2.0, 0.1);
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::vector<int64_t>& counts = m.tokens_per_expert(l);
    ASSERT_EQ(counts.size(), 4u);
    int64_t sum = 0;
    for (int64_t n : counts) sum += n;
    EXPECT_EQ(sum, 12 * 2);  // every token's two choices
  }
}

// The float MoE model trains; it must agree with the double one, to the tolerances of the
// dense float_model_matches_double_model (routing decisive, so float rounding flips none).
TEST(moe_gpt, float_model_matches_double_model) {
  const model_config cfg = moe_config(2, 1.0);
  basic_gpt<double> md(cfg);
  init_for_gradcheck(md, 5);
  gpt mf(cfg);
  for (size_t i = 0; i < mf.num_params(); ++i) mf.params()[i] = static_cast<float>(md.params()[i]);
  for (size_t i = 0; i < md.num_params(); ++i) md.params()[i] = mf.params()[i];
  const batch b(12, 4);
  mf.zero_grads();
  md.zero_grads();
  const double lf = mf.forward_backward(b.inputs.data(), b.targets.data(), 2, 6, 1.0f);
  const double ld = md.forward_backward(b.inputs.data(), b.targets.data(), 2, 6, 1.0f);
  EXPECT_NEAR(lf, ld, 1e-6 * ld);
  for (int l = 0; l < cfg.n_layer; ++l) {
    EXPECT_EQ(mf.tokens_per_expert(l), md.tokens_per_expert(l));
  }
  for (const param_tensor& t : mf.param_table()) {
    double num = 0, den = 0;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      const double d = md.grads()[i];
      num += (mf.grads()[i] - d) * (mf.grads()[i] - d);
      den += d * d;
    }
    if (den == 0) continue;
    EXPECT_LT(std::sqrt(num / den), 1e-4) << t.name;
  }
}

}  // namespace
}  // namespace troupe
