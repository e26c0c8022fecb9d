// Gradient checks of every layer's backward pass.
//
// Method: each layer is instantiated in double and its backward is compared with
// fourth-order central finite differences of the scalar objective dot(output, R) for a
// fixed random R (so the incoming gradient is R), on EVERY input coordinate; the relative
// error must stay below gradcheck_tolerance = 1e-6 (gradcheck.hpp says why a correct
// gradient scores ~1e-7 at worst).
// Then the float instantiation, which training uses, is run on the same values and its
// outputs and gradients must match the double ones to 1e-5 relative (L2 norm).

#include "runtime/model/layers.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tests/runtime/gradcheck.hpp"

namespace troupe {
namespace {

using testing::dot;
using testing::gradcheck;
using testing::gradcheck_tolerance;
using testing::random_vector;
using results = std::vector<std::vector<double>>;

template <typename F>
std::vector<F> cast(const std::vector<double>& v) {
  return std::vector<F>(v.begin(), v.end());
}
template <typename F>
std::vector<double> widen(const std::vector<F>& v) {
  return std::vector<double>(v.begin(), v.end());
}

double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / (std::sqrt(den) + 1e-30);
}

/// Runs the double and float instantiations of a layer case and checks both. A case has
/// R (the incoming gradient), inputs() (the arrays to differentiate) and run<F>() returning
/// {output, gradient of inputs()[0], gradient of inputs()[1], ...}.
template <typename Case>
void check_layer(Case& c) {
  const results ref = c.template run<double>();
  const std::vector<std::vector<double>*> ins = c.inputs();
  ASSERT_EQ(ref.size(), ins.size() + 1);
  for (size_t k = 0; k < ins.size(); ++k) {
    auto f = [&] { return dot(c.template run<double>()[0], c.R); };
    const double err = gradcheck(f, ins[k]->data(), ref[k + 1].data(), ins[k]->size());
    EXPECT_LT(err, gradcheck_tolerance) << "gradient of input " << k;
  }
  const results fl = c.template run<float>();
  for (size_t j = 0; j < ref.size(); ++j) {
    EXPECT_LT(rel_diff(fl[j], ref[j]), 1e-5) << "float vs double, result " << j;
  }
}

struct embedding_case {
  int B = 2, T = 3, C = 4, V = 5;
  std::vector<token_id> tokens{0, 3, 3, 4, 1, 0};  // repeats exercise the accumulation
  std::vector<double> wte = random_vector(V * C, 1);
  std::vector<double> wpe = random_vector(T * C, 2);
  std::vector<double> R = random_vector(B * T * C, 3);
  std::vector<std::vector<double>*> inputs() { return {&wte, &wpe}; }
  template <typename F>
  results run() const {
    std::vector<F> out(R.size()), dwte(wte.size()), dwpe(wpe.size());
    const auto te = cast<F>(wte), pe = cast<F>(wpe), dout = cast<F>(R);
    layers::embedding_forward(out.data(), tokens.data(), te.data(), pe.data(), B, T, C);
    layers::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    return {widen(out), widen(dwte), widen(dwpe)};
  }
};

struct layernorm_case {
  int N = 3, C = 5;
  std::vector<double> x = random_vector(N * C, 4, 2.0);
  std::vector<double> w = random_vector(C, 5);
  std::vector<double> b = random_vector(C, 6);
  std::vector<double> R = random_vector(N * C, 7);
  std::vector<std::vector<double>*> inputs() { return {&x, &w, &b}; }
  template <typename F>
  results run() const {
    std::vector<F> out(x.size()), mean(N), rstd(N), dx(x.size()), dw(C), db(C);
    const auto xf = cast<F>(x), wf = cast<F>(w), bf = cast<F>(b), dout = cast<F>(R);
    layers::layernorm_forward(out.data(), mean.data(), rstd.data(), xf.data(), wf.data(), bf.data(),
                              N, C);
    layers::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), xf.data(), wf.data(),
                               mean.data(), rstd.data(), N, C);
    return {widen(out), widen(dx), widen(dw), widen(db)};
  }
};

struct linear_case {
  int N = 4, C = 3, OC = 5;
  std::vector<double> x = random_vector(N * C, 8);
  std::vector<double> w = random_vector(OC * C, 9);
  std::vector<double> b = random_vector(OC, 10);
  std::vector<double> R = random_vector(N * OC, 11);
  std::vector<std::vector<double>*> inputs() { return {&x, &w, &b}; }
  template <typename F>
  results run() const {
    std::vector<F> out(R.size()), dx(x.size()), dw(w.size()), db(b.size());
    const auto xf = cast<F>(x), wf = cast<F>(w), bf = cast<F>(b), dout = cast<F>(R);
    layers::linear_forward(out.data(), xf.data(), wf.data(), bf.data(), N, C, OC);
    layers::linear_backward(dx.data(), dw.data(), db.data(), dout.data(), xf.data(), wf.data(), N,
                            C, OC);
    return {widen(out), widen(dx), widen(dw), widen(db)};
  }
};

struct attention_case {
  int B = 2, T = 11, C = 6, NH = 2;  // rows of 1..11 scores: vector and scalar softmax paths
  std::vector<double> qkv = random_vector(B * T * 3 * C, 12);
  std::vector<double> R = random_vector(B * T * C, 13);
  std::vector<std::vector<double>*> inputs() { return {&qkv}; }
  template <typename F>
  results run() const {
    std::vector<F> out(R.size()), att(B * NH * T * T), scratch(T * T), dqkv(qkv.size());
    const auto q = cast<F>(qkv), dout = cast<F>(R);
    layers::attention_forward(out.data(), att.data(), q.data(), B, T, C, NH);
    layers::attention_backward(dqkv.data(), scratch.data(), dout.data(), q.data(), att.data(), B, T,
                               C, NH);
    return {widen(out), widen(dqkv)};
  }
};

struct gelu_case {
  std::vector<double> x = random_vector(43, 14, 2.5);
  std::vector<double> R = random_vector(43, 15);
  std::vector<std::vector<double>*> inputs() { return {&x}; }
  template <typename F>
  results run() const {
    std::vector<F> out(x.size()), dx(x.size());
    const auto xf = cast<F>(x), dout = cast<F>(R);
    layers::gelu_forward(out.data(), xf.data(), x.size());
    layers::gelu_backward(dx.data(), xf.data(), dout.data(), x.size());
    return {widen(out), widen(dx)};
  }
};

struct residual_case {
  std::vector<double> a = random_vector(12, 16), b = random_vector(12, 17);
  std::vector<double> R = random_vector(12, 18);
  std::vector<std::vector<double>*> inputs() { return {&a, &b}; }
  template <typename F>
  results run() const {
    std::vector<F> out(a.size()), da(a.size()), db(b.size());
    const auto af = cast<F>(a), bf = cast<F>(b), dout = cast<F>(R);
    layers::residual_forward(out.data(), af.data(), bf.data(), a.size());
    layers::residual_backward(da.data(), db.data(), dout.data(), a.size());
    return {widen(out), widen(da), widen(db)};
  }
};

struct crossentropy_case {
  int N = 4, V = 37;  // not a multiple of 8: vector and scalar exp paths
  double dloss = 0.7;
  std::vector<token_id> targets{0, 36, 3, 3};
  std::vector<double> logits = random_vector(N * V, 19, 3.0);
  std::vector<double> R{1.0};  // the output is dloss * (sum of losses) itself
  std::vector<std::vector<double>*> inputs() { return {&logits}; }
  template <typename F>
  results run() const {
    std::vector<F> probs(logits.size()), dlogits(logits.size());
    const auto lf = cast<F>(logits);
    const double loss =
        layers::softmax_crossentropy_forward(probs.data(), lf.data(), targets.data(), N, V);
    layers::softmax_crossentropy_backward(dlogits.data(), probs.data(), targets.data(),
                                          static_cast<F>(dloss), N, V);
    return {{dloss * loss}, widen(dlogits)};
  }
};

TEST(layers, embedding_backward_matches_finite_differences) {
  embedding_case c;
  check_layer(c);
}
TEST(layers, layernorm_backward_matches_finite_differences) {
  layernorm_case c;
  check_layer(c);
}
TEST(layers, linear_backward_matches_finite_differences) {
  linear_case c;
  check_layer(c);
}
TEST(layers, attention_backward_matches_finite_differences) {
  attention_case c;
  check_layer(c);
}
TEST(layers, gelu_backward_matches_finite_differences) {
  gelu_case c;
  check_layer(c);
}
TEST(layers, residual_backward_matches_finite_differences) {
  residual_case c;
  check_layer(c);
}
TEST(layers, softmax_crossentropy_backward_matches_finite_differences) {
  crossentropy_case c;
  check_layer(c);
}

// The check must be able to fail: a gradient off by 1% on one coordinate, or with one
// term dropped, is reported far above the tolerance.
TEST(layers, gradcheck_catches_a_wrong_gradient) {
  linear_case c;
  results ref = c.run<double>();
  auto f = [&] { return dot(c.run<double>()[0], c.R); };
  std::vector<double> off_by_one_percent = ref[2];
  off_by_one_percent[7] *= 1.01;
  EXPECT_GT(gradcheck(f, c.w.data(), off_by_one_percent.data(), c.w.size()),
            1000 * gradcheck_tolerance);

  gelu_case g;
  results gref = g.run<double>();
  auto gf = [&] { return dot(g.run<double>()[0], g.R); };
  // GELU's derivative without its tanh' term: what forgetting the chain rule looks like.
  std::vector<double> missing_term(g.x.size());
  for (size_t i = 0; i < g.x.size(); ++i) {
    const double x = g.x[i];
    missing_term[i] = 0.5 * (1 + std::tanh(0.7978845608 * (x + 0.044715 * x * x * x))) * g.R[i];
  }
  EXPECT_GT(gradcheck(gf, g.x.data(), missing_term.data(), g.x.size()), 1e-2);
  EXPECT_LT(gradcheck(gf, g.x.data(), gref[1].data(), g.x.size()), gradcheck_tolerance);
}

// Backward passes accumulate: a second call adds the same gradient again.
TEST(layers, backward_accumulates_into_its_outputs) {
  linear_case c;
  std::vector<double> out(c.N * c.OC), dx(c.x.size()), dw(c.w.size()), db(c.b.size());
  layers::linear_forward(out.data(), c.x.data(), c.w.data(), c.b.data(), c.N, c.C, c.OC);
  for (int rep = 0; rep < 2; ++rep) {
    layers::linear_backward(dx.data(), dw.data(), db.data(), c.R.data(), c.x.data(), c.w.data(),
                            c.N, c.C, c.OC);
  }
  const results once = c.run<double>();
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], 2 * once[2][i], 1e-12);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx[i], 2 * once[1][i], 1e-12);
}

// The float GELU runs on an eight-wide exp approximation; over a range wide enough to
// saturate it, each value and derivative must agree with the double (libm) version to
// 2e-6 absolute + 1e-5 relative (the derivative crosses zero near x = -0.75).
TEST(layers, float_gelu_matches_double_far_into_the_tails) {
  const size_t n = 1001;  // not a multiple of 8
  std::vector<double> x(n), ones(n, 1.0), out(n), grad(n);
  for (size_t i = 0; i < n; ++i) x[i] = -30.0 + 60.0 * static_cast<double>(i) / (n - 1);
  layers::gelu_forward(out.data(), x.data(), n);
  layers::gelu_backward(grad.data(), x.data(), ones.data(), n);
  const std::vector<float> xf = cast<float>(x), onesf = cast<float>(ones);
  std::vector<float> outf(n), gradf(n);
  layers::gelu_forward(outf.data(), xf.data(), n);
  layers::gelu_backward(gradf.data(), xf.data(), onesf.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const double xi = xf[i];  // the float input, widened
    double o = 0, g = 0, one = 1;
    layers::gelu_forward(&o, &xi, 1);
    layers::gelu_backward(&g, &xi, &one, 1);
    EXPECT_NEAR(outf[i], o, 2e-6 + 1e-5 * std::abs(o)) << "x = " << xi;
    EXPECT_NEAR(gradf[i], g, 2e-6 + 1e-5 * std::abs(g)) << "x = " << xi;
  }
  EXPECT_EQ(outf[0], 0.0f);       // gelu(-30) underflows to zero, not NaN
  EXPECT_EQ(outf[n - 1], 30.0f);  // gelu(30) = 30
  EXPECT_EQ(gradf[n - 1], 1.0f);
}

// Softmax rows with a huge spread: the float exp saturates to exact zeros, never to
// denormals, infinities or NaN; and a NaN logit still shows as a NaN loss.
TEST(layers, float_crossentropy_is_stable_for_extreme_logits) {
  const int N = 2, V = 40;
  std::vector<float> logits(N * V, 0.0f), probs(N * V);
  logits[3] = 1000.0f;       // row 0: one dominant logit
  logits[V + 5] = -1000.0f;  // row 1: one hopeless target
  const std::vector<token_id> targets{3, 5};
  const double loss =
      layers::softmax_crossentropy_forward(probs.data(), logits.data(), targets.data(), N, V);
  EXPECT_NEAR(loss, 0.0 + (1000.0 + std::log(39.0)), 1e-3);
  EXPECT_FLOAT_EQ(probs[3], 1.0f);
  EXPECT_EQ(probs[4], 0.0f);
  EXPECT_EQ(probs[V + 5], 0.0f);
  logits[V + 20] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(
      layers::softmax_crossentropy_forward(probs.data(), logits.data(), targets.data(), N, V)));
}

TEST(layers, attention_is_causal) {
  // Changing the last token's q, k, v must leave every earlier output untouched.
  attention_case c;
  const std::vector<double> before = c.run<double>()[0];
  for (int j = 0; j < 3 * c.C; ++j) c.qkv[(c.T - 1) * 3 * c.C + j] += 1.0;  // batch 0, t = T-1
  const std::vector<double> after = c.run<double>()[0];
  for (int t = 0; t < c.T - 1; ++t) {
    for (int j = 0; j < c.C; ++j) EXPECT_EQ(before[t * c.C + j], after[t * c.C + j]);
  }
  EXPECT_NE(before[(c.T - 1) * c.C], after[(c.T - 1) * c.C]);
}

}  // namespace
}  // namespace troupe
