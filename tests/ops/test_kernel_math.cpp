// The per-element math the CPU and CUDA kernels share (QUIVER_HD functions in namespace
// quiver::math, ops/*.h), tested on the CPU against closed forms, hand-computed values and central
// differences in double. With no GPU on the development machines this is where the arithmetic
// of the CUDA kernels is checked; tests/cuda/test_cuda_ops.cpp compares the kernels themselves.
// Not here: the SMA math of runtime/sma_math.h (a runtime concern, tested with SMA).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ops/elementwise.h"
#include "ops/lstm.h"
#include "ops/optimizer.h"
#include "ops/pool.h"
#include "ops/softmax_cross_entropy.h"

namespace quiver {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

double sigmoid_exact(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Central difference in double: accurate to ~1e-10 here, far below float rounding.
template <typename Fn>
double derivative(Fn fn, double x, double h = 1e-5) {
  return (fn(x + h) - fn(x - h)) / (2.0 * h);
}

// ---- elementwise -------------------------------------------------------------------------------

TEST(KernelMath, AddAndMul) {
  EXPECT_EQ(math::add(1.5f, -0.25f), 1.25f);
  EXPECT_EQ(math::mul(-3.0f, 0.5f), -1.5f);
  EXPECT_TRUE(std::isnan(math::add(kNaN, 1.0f)));
  EXPECT_TRUE(std::isnan(math::mul(kInf, 0.0f)));
}

TEST(KernelMath, ReluIsZeroAtAndBelowZeroAndPassesNaN) {
  EXPECT_EQ(math::relu(0.0f), 0.0f);
  EXPECT_EQ(math::relu(-0.0f), 0.0f);  // compares equal to +0
  EXPECT_EQ(math::relu(-2.5f), 0.0f);
  EXPECT_EQ(math::relu(-std::numeric_limits<float>::denorm_min()), 0.0f);
  EXPECT_EQ(math::relu(3.25f), 3.25f);
  EXPECT_EQ(math::relu(std::numeric_limits<float>::denorm_min()), std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(math::relu(-kInf), 0.0f);
  EXPECT_EQ(math::relu(kInf), kInf);
  // A diverged run stays visible: NaN is not clamped to 0.
  EXPECT_TRUE(std::isnan(math::relu(kNaN)));
}

TEST(KernelMath, ReluGradRoutesThroughPositiveOutputsOnly) {
  EXPECT_EQ(math::relu_grad(0.75f, 2.0f), 0.75f);
  EXPECT_EQ(math::relu_grad(-0.75f, 2.0f), -0.75f);
  EXPECT_EQ(math::relu_grad(0.75f, 0.0f), 0.0f);  // at the kink (y == 0) the gradient is 0
  EXPECT_EQ(math::relu_grad(0.75f, -0.0f), 0.0f);
  EXPECT_TRUE(std::isnan(math::relu_grad(kNaN, 1.0f)));
  // A NaN output is not below the kink: dy passes, a NaN dy as NaN, as relu passed the NaN on.
  EXPECT_EQ(math::relu_grad(0.75f, kNaN), 0.75f);
  EXPECT_TRUE(std::isnan(math::relu_grad(kNaN, kNaN)));
}

TEST(KernelMath, SigmoidMatchesClosedForm) {
  EXPECT_EQ(math::sigmoid(0.0f), 0.5f);
  for (float x = -12.0f; x <= 12.0f; x += 0.37f) {
    const double expected = sigmoid_exact(x);
    EXPECT_NEAR(math::sigmoid(x), expected, 2e-7 * std::max(1e-3, expected) + 1e-7 * expected) << "x = " << x;
    EXPECT_NEAR(math::sigmoid(x) + math::sigmoid(-x), 1.0, 2e-7) << "x = " << x;
  }
}

TEST(KernelMath, SigmoidSaturatesWithoutNaN) {
  EXPECT_EQ(math::sigmoid(20.0f), 1.0f);
  EXPECT_EQ(math::sigmoid(100.0f), 1.0f);
  EXPECT_EQ(math::sigmoid(1000.0f), 1.0f);
  // exp(-x) overflows to inf for x below about -88.7: the result is 0, not NaN.
  EXPECT_EQ(math::sigmoid(-100.0f), 0.0f);
  EXPECT_EQ(math::sigmoid(-1000.0f), 0.0f);
  EXPECT_EQ(math::sigmoid(kInf), 1.0f);
  EXPECT_EQ(math::sigmoid(-kInf), 0.0f);
  // The far tail keeps its relative precision (no 1 - tiny cancellation).
  EXPECT_NEAR(math::sigmoid(-20.0f), sigmoid_exact(-20.0), 1e-6 * sigmoid_exact(-20.0));
  EXPECT_TRUE(std::isnan(math::sigmoid(kNaN)));
}

TEST(KernelMath, TanhMatchesClosedFormAndSaturates) {
  EXPECT_EQ(math::tanh(0.0f), 0.0f);
  for (float x = -6.0f; x <= 6.0f; x += 0.29f) {
    EXPECT_NEAR(math::tanh(x), std::tanh(static_cast<double>(x)), 2e-7) << "x = " << x;
    EXPECT_EQ(math::tanh(-x), -math::tanh(x)) << "x = " << x;
  }
  EXPECT_EQ(math::tanh(20.0f), 1.0f);
  EXPECT_EQ(math::tanh(-20.0f), -1.0f);
  EXPECT_EQ(math::tanh(kInf), 1.0f);
  EXPECT_EQ(math::tanh(-kInf), -1.0f);
  EXPECT_TRUE(std::isnan(math::tanh(kNaN)));
}

// The activation gradients take the forward output y, not x: check them against the derivative
// of the activation at the x that produced y.
TEST(KernelMath, ActivationGradientsMatchCentralDifferences) {
  for (double x = -6.0; x <= 6.0; x += 0.41) {
    const float sigmoid_y = math::sigmoid(static_cast<float>(x));
    const float tanh_y = math::tanh(static_cast<float>(x));
    const double d_sigmoid = derivative(sigmoid_exact, x);
    const double d_tanh = derivative([](double v) { return std::tanh(v); }, x);
    EXPECT_NEAR(math::sigmoid_grad(1.0f, sigmoid_y), d_sigmoid, 1e-6) << "x = " << x;
    EXPECT_NEAR(math::tanh_grad(1.0f, tanh_y), d_tanh, 1e-6) << "x = " << x;
    EXPECT_NEAR(math::sigmoid_grad(-2.5f, sigmoid_y), -2.5 * d_sigmoid, 3e-6) << "x = " << x;
    EXPECT_NEAR(math::tanh_grad(-2.5f, tanh_y), -2.5 * d_tanh, 3e-6) << "x = " << x;
  }
  EXPECT_EQ(math::sigmoid_grad(1.0f, 0.5f), 0.25f);
  EXPECT_EQ(math::tanh_grad(0.75f, 0.0f), 0.75f);
  // Saturated units pass no gradient.
  EXPECT_EQ(math::sigmoid_grad(1.0f, 1.0f), 0.0f);
  EXPECT_EQ(math::sigmoid_grad(1.0f, 0.0f), 0.0f);
  EXPECT_EQ(math::tanh_grad(1.0f, 1.0f), 0.0f);
  EXPECT_EQ(math::tanh_grad(1.0f, -1.0f), 0.0f);
}

// ---- optimizer updates -------------------------------------------------------------------------

TEST(KernelMath, SgdStepWithMomentumAndWeightDecayOverTwoSteps) {
  // v = mu*v - lr*(g + wd*w); w += v, with lr 0.1, mu 0.9, wd 0.1, g 0.5, from w 1, v 0:
  //   step 1: v = -0.1*(0.5 + 0.1)                 = -0.06,    w = 0.94
  //   step 2: v = 0.9*(-0.06) - 0.1*(0.5 + 0.094)  = -0.1134,  w = 0.8266
  float w = 1.0f, v = 0.0f;
  math::sgd_step(w, v, 0.5f, 0.1f, 0.9f, 0.1f);
  EXPECT_NEAR(v, -0.06, 1e-7);
  EXPECT_NEAR(w, 0.94, 1e-7);
  math::sgd_step(w, v, 0.5f, 0.1f, 0.9f, 0.1f);
  EXPECT_NEAR(v, -0.1134, 2e-7);
  EXPECT_NEAR(w, 0.8266, 2e-7);
}

TEST(KernelMath, SgdStepWithoutMomentumOrDecayIsPlainGradientDescent) {
  float w = 2.0f, v = 0.0f;
  math::sgd_step(w, v, -4.0f, 0.25f, 0.0f, 0.0f);
  EXPECT_EQ(w, 3.0f);
  EXPECT_EQ(v, 1.0f);
  math::sgd_step(w, v, 0.0f, 0.25f, 0.0f, 0.0f);  // no momentum: the old velocity is forgotten
  EXPECT_EQ(w, 3.0f);
  EXPECT_EQ(v, 0.0f);
  math::sgd_step(w, v, kNaN, 0.25f, 0.9f, 0.0f);
  EXPECT_TRUE(std::isnan(w));
}

constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEpsilon = 1e-8f;

// At step 1 bias correction turns m and v back into g and g*g, so the move is lr * g/(|g| + eps):
// lr in the direction of -g, whatever the gradient's size. Uncorrected it would be about
// lr * 0.1/sqrt(0.001) = 3.16 lr.
TEST(KernelMath, AdamStepOneIsBiasCorrected) {
  for (float g : {0.5f, -3.0f, 1e-3f, 40.0f}) {
    float w = 1.0f, m = 0.0f, v = 0.0f;
    math::adam_step(w, m, v, g, 0.01f, kBeta1, kBeta2, kEpsilon, 0.0f, math::adam_correction(kBeta1, kBeta2, 1.0f));
    EXPECT_NEAR(m, 0.1 * g, 1e-6 * std::fabs(g)) << "g = " << g;
    EXPECT_NEAR(v, 0.001 * g * g, 1e-6 * g * g) << "g = " << g;
    EXPECT_NEAR(w, 1.0 - 0.01 * (g > 0 ? 1.0 : -1.0), 1e-6) << "g = " << g;
  }
}

// A constant gradient keeps m_hat = g and v_hat = g*g at every step (m_t = (1 - beta1^t) g), so
// each step moves w by lr.
TEST(KernelMath, AdamWithConstantGradientMovesByTheLearningRateEachStep) {
  float w = 0.5f, m = 0.0f, v = 0.0f;
  for (int step = 1; step <= 5; ++step) {
    math::adam_step(w, m, v, -0.2f, 0.01f, kBeta1, kBeta2, kEpsilon, 0.0f,
                    math::adam_correction(kBeta1, kBeta2, static_cast<float>(step)));
    EXPECT_NEAR(w, 0.5 + 0.01 * step, 1e-6) << "step " << step;
    EXPECT_NEAR(m, -0.2 * (1.0 - std::pow(0.9, step)), 1e-6) << "step " << step;
  }
}

TEST(KernelMath, AdamMatchesClosedFormMidTraining) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int trial = 0; trial < 50; ++trial) {
    const float w0 = unit(rng), m0 = 0.1f * unit(rng), v0 = 0.01f * std::fabs(unit(rng)), g = unit(rng);
    const float lr = 0.003f, wd = 0.01f, step = static_cast<float>(2 + trial % 7);
    float w = w0, m = m0, v = v0;
    math::adam_step(w, m, v, g, lr, kBeta1, kBeta2, kEpsilon, wd, math::adam_correction(kBeta1, kBeta2, step));
    // The closed form in double, with the float constants the kernel gets.
    const double b1 = kBeta1, b2 = kBeta2;
    const double ge = g + static_cast<double>(wd) * w0;
    const double me = b1 * m0 + (1.0 - b1) * ge, ve = b2 * v0 + (1.0 - b2) * ge * ge;
    const double m_hat = me / (1.0 - std::pow(b1, step)), v_hat = ve / (1.0 - std::pow(b2, step));
    const double we = w0 - static_cast<double>(lr) * m_hat / (std::sqrt(v_hat) + static_cast<double>(kEpsilon));
    EXPECT_NEAR(m, me, 1e-6 * std::max(1e-3, std::fabs(me))) << "trial " << trial;
    EXPECT_NEAR(v, ve, 1e-5 * ve + 1e-12) << "trial " << trial;
    EXPECT_NEAR(w, we, 1e-6) << "trial " << trial;
  }
}

// Weight decay joins the gradient before the moments (L2, not decoupled): a small negative
// gradient on a large weight still moves the weight down.
TEST(KernelMath, AdamWeightDecayEntersTheGradient) {
  float w = 1.0f, m = 0.0f, v = 0.0f;
  math::adam_step(w, m, v, -0.005f, 0.01f, kBeta1, kBeta2, kEpsilon, 0.01f,  // g + wd*w = 0.005
                  math::adam_correction(kBeta1, kBeta2, 1.0f));
  EXPECT_NEAR(m, 0.1 * 0.005, 1e-9);
  EXPECT_NEAR(v, 0.001 * 0.005 * 0.005, 1e-12);
  EXPECT_NEAR(w, 0.99, 1e-6);
}

TEST(KernelMath, AdamWithZeroGradientLeavesTheWeight) {
  float w = 0.25f, m = 0.0f, v = 0.0f;
  math::adam_step(w, m, v, 0.0f, 0.01f, kBeta1, kBeta2, kEpsilon, 0.0f, math::adam_correction(kBeta1, kBeta2, 1.0f));
  EXPECT_EQ(w, 0.25f);  // 0 / (0 + epsilon): no NaN
  EXPECT_EQ(m, 0.0f);
  EXPECT_EQ(v, 0.0f);
}

// ---- LSTM cell ---------------------------------------------------------------------------------
// Through the row functions of ops/lstm_cell.cpp, the code the CPU kernels run (built with
// -ffast-math): one unit at a time, and whole rows, where the loops are vectorized.

math::LstmCell cell_forward(float pre_i, float pre_f, float pre_g, float pre_o, float c_prev) {
  const float pre[4] = {pre_i, pre_f, pre_g, pre_o};
  float cell[5], h = 0.0f;
  lstm_cell_row_forward(cell, &h, pre, &c_prev, 1);
  return {cell[0], cell[1], cell[2], cell[3], cell[4], h};
}

math::LstmCellGrad cell_backward(const math::LstmCell& cell, float c_prev, float dh, float dc_next) {
  const float saved[5] = {cell.i, cell.f, cell.g, cell.o, cell.c};
  const float no_carry = 0.0f;
  float d_pre[4], dc = dc_next;
  lstm_cell_row_backward(d_pre, &dc, saved, &c_prev, &dh, &no_carry, 1);
  return {d_pre[0], d_pre[1], d_pre[2], d_pre[3], dc};
}

struct CellExact {
  double c, h;
};

CellExact cell_exact(double pre_i, double pre_f, double pre_g, double pre_o, double c_prev) {
  const double c = sigmoid_exact(pre_f) * c_prev + sigmoid_exact(pre_i) * std::tanh(pre_g);
  return {c, sigmoid_exact(pre_o) * std::tanh(c)};
}

TEST(KernelMath, LstmCellForwardMatchesClosedForm) {
  const math::LstmCell zero = cell_forward(0.0f, 0.0f, 0.0f, 0.0f, 0.8f);
  EXPECT_EQ(zero.i, 0.5f);
  EXPECT_EQ(zero.f, 0.5f);
  EXPECT_EQ(zero.g, 0.0f);
  EXPECT_EQ(zero.o, 0.5f);
  EXPECT_NEAR(zero.c, 0.4, 1e-7);
  EXPECT_NEAR(zero.h, 0.5 * std::tanh(0.4), 1e-7);

  std::mt19937 rng(5);
  std::uniform_real_distribution<float> pre(-3.0f, 3.0f);
  for (int trial = 0; trial < 50; ++trial) {
    const float pi = pre(rng), pf = pre(rng), pg = pre(rng), po = pre(rng), c_prev = pre(rng);
    const math::LstmCell cell = cell_forward(pi, pf, pg, po, c_prev);
    const CellExact exact = cell_exact(pi, pf, pg, po, c_prev);
    EXPECT_NEAR(cell.i, sigmoid_exact(pi), 1e-6) << "trial " << trial;
    EXPECT_NEAR(cell.f, sigmoid_exact(pf), 1e-6) << "trial " << trial;
    EXPECT_NEAR(cell.g, std::tanh(static_cast<double>(pg)), 1e-6) << "trial " << trial;
    EXPECT_NEAR(cell.o, sigmoid_exact(po), 1e-6) << "trial " << trial;
    EXPECT_NEAR(cell.c, exact.c, 2e-6) << "trial " << trial;
    EXPECT_NEAR(cell.h, exact.h, 2e-6) << "trial " << trial;
  }
}

// Saturated gates: the forget gate open and the input gate shut keep the cell exactly. (A gate
// stops at 1.8e-35, the sigmoid of -80: math::lstm_gate.)
TEST(KernelMath, LstmCellSaturatedGatesKeepTheCell) {
  const math::LstmCell cell = cell_forward(-100.0f, 100.0f, 0.3f, 100.0f, -0.6f);
  EXPECT_GE(cell.i, 0.0f);
  EXPECT_LT(cell.i, 1e-34f);
  EXPECT_EQ(cell.f, 1.0f);
  EXPECT_EQ(cell.o, 1.0f);
  EXPECT_EQ(cell.c, -0.6f);
  EXPECT_EQ(cell.h, std::tanh(-0.6f));
}

// A NaN pre-activation of any gate, or a NaN previous cell, reaches that unit's cell and output, so
// a diverged layer shows. Rows of 1, 16 and 128 units: in the vectorized loop (16 and more) the
// sigmoid's clamp became a max, which turned a NaN into a gate of 1.8e-35 and a finite output.
TEST(KernelMath, LstmCellRowsPassANanOnInEveryGate) {
  for (const int64_t hidden : {int64_t{1}, int64_t{16}, int64_t{128}})
    for (int gate = 0; gate <= 4; ++gate) {  // i, f, g, o, then c_prev
      std::vector<float> pre(static_cast<size_t>(4 * hidden), 0.25f), c_prev(static_cast<size_t>(hidden), 0.5f);
      std::vector<float> cell(static_cast<size_t>(5 * hidden)), h(static_cast<size_t>(hidden));
      const int64_t unit = hidden / 2;
      (gate < 4 ? pre[static_cast<size_t>(gate * hidden + unit)] : c_prev[static_cast<size_t>(unit)]) = std::nanf("");
      lstm_cell_row_forward(cell.data(), h.data(), pre.data(), c_prev.data(), hidden);
      for (int64_t j = 0; j < hidden; ++j) {
        const bool poisoned = j == unit;
        EXPECT_EQ(std::isnan(h[static_cast<size_t>(j)]), poisoned) << "hidden " << hidden << ", gate " << gate << ", unit " << j;
        EXPECT_EQ(std::isnan(cell[static_cast<size_t>(4 * hidden + j)]), poisoned && gate != 3)
            << "hidden " << hidden << ", gate " << gate << ", unit " << j;  // o does not enter c
      }
    }
}

// The cell's backward against central differences of L = dh*h + dc_next*c over the five inputs
// of the forward (the four pre-activations and c_prev).
TEST(KernelMath, LstmCellBackwardMatchesCentralDifferences) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> pre(-2.0f, 2.0f);
  for (int trial = 0; trial < 50; ++trial) {
    double in[5];
    for (double& value : in) value = pre(rng);
    const float dh = pre(rng), dc_next = pre(rng);
    const math::LstmCell cell = cell_forward(static_cast<float>(in[0]), static_cast<float>(in[1]),
                                                        static_cast<float>(in[2]), static_cast<float>(in[3]),
                                                        static_cast<float>(in[4]));
    const math::LstmCellGrad grad = cell_backward(cell, static_cast<float>(in[4]), dh, dc_next);
    const float analytic[5] = {grad.d_pre_i, grad.d_pre_f, grad.d_pre_g, grad.d_pre_o, grad.dc_prev};
    const char* names[5] = {"d_pre_i", "d_pre_f", "d_pre_g", "d_pre_o", "dc_prev"};
    for (int k = 0; k < 5; ++k) {
      auto loss = [&](double value) {
        double at[5] = {in[0], in[1], in[2], in[3], in[4]};
        at[k] = value;
        const CellExact exact = cell_exact(at[0], at[1], at[2], at[3], at[4]);
        return dh * exact.h + dc_next * exact.c;
      };
      const double numeric = derivative(loss, in[k]);
      EXPECT_NEAR(analytic[k], numeric, 1e-5 * std::max(1.0, std::fabs(numeric))) << names[k] << ", trial " << trial;
    }
  }
}

// A whole row (the vectorized loops, and the layout: gates i, f, g, o, c in blocks of H) against
// the closed form, forward and backward, with the carried dh added to the step's.
TEST(KernelMath, LstmCellRowsMatchTheClosedFormUnitByUnit) {
  constexpr int64_t H = 37;  // not a multiple of any vector width: the loops' tails run too
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  std::vector<float> pre(4 * H), c_prev(H), cell(5 * H), h(H), dh(H), dh_carry(H), dc(H), d_pre(4 * H);
  for (std::vector<float>* buffer : {&pre, &c_prev, &dh, &dh_carry, &dc})
    for (float& x : *buffer) x = value(rng);
  const std::vector<float> dc_next = dc;
  lstm_cell_row_forward(cell.data(), h.data(), pre.data(), c_prev.data(), H);
  lstm_cell_row_backward(d_pre.data(), dc.data(), cell.data(), c_prev.data(), dh.data(), dh_carry.data(), H);
  for (int64_t j = 0; j < H; ++j) {
    const double in[5] = {pre[j], pre[H + j], pre[2 * H + j], pre[3 * H + j], c_prev[j]};
    const CellExact exact = cell_exact(in[0], in[1], in[2], in[3], in[4]);
    EXPECT_NEAR(cell[j], sigmoid_exact(in[0]), 1e-6) << "unit " << j;
    EXPECT_NEAR(cell[H + j], sigmoid_exact(in[1]), 1e-6) << "unit " << j;
    EXPECT_NEAR(cell[2 * H + j], std::tanh(in[2]), 1e-6) << "unit " << j;
    EXPECT_NEAR(cell[3 * H + j], sigmoid_exact(in[3]), 1e-6) << "unit " << j;
    EXPECT_NEAR(cell[4 * H + j], exact.c, 1e-5) << "unit " << j;
    EXPECT_NEAR(h[j], exact.h, 1e-5) << "unit " << j;
    const double dh_total = static_cast<double>(dh[j]) + dh_carry[j];
    const double analytic[5] = {d_pre[j], d_pre[H + j], d_pre[2 * H + j], d_pre[3 * H + j], dc[j]};
    for (int k = 0; k < 5; ++k) {
      auto loss = [&](double x) {
        double at[5] = {in[0], in[1], in[2], in[3], in[4]};
        at[k] = x;
        const CellExact moved = cell_exact(at[0], at[1], at[2], at[3], at[4]);
        return dh_total * moved.h + dc_next[j] * moved.c;
      };
      const double numeric = derivative(loss, in[k]);
      EXPECT_NEAR(analytic[k], numeric, 2e-5 * std::max(1.0, std::fabs(numeric))) << "unit " << j << ", input " << k;
    }
  }
}

// ---- softmax cross-entropy ---------------------------------------------------------------------

// The kernels' composition of the pieces for one row: loss and probabilities.
double row_loss(const float* logits, int classes, int label, float* probabilities) {
  float max_logit = logits[0];
  for (int c = 1; c < classes; ++c) max_logit = std::max(max_logit, logits[c]);
  double sum = 0.0;
  for (int c = 0; c < classes; ++c) {
    probabilities[c] = math::softmax_shifted_exp(logits[c], max_logit);
    sum += probabilities[c];
  }
  for (int c = 0; c < classes; ++c) probabilities[c] = math::softmax_normalize(probabilities[c], sum);
  return math::softmax_cross_entropy_row(sum, max_logit, logits[label]);
}

TEST(KernelMath, SoftmaxCrossEntropyPiecesMatchClosedForm) {
  EXPECT_EQ(math::softmax_shifted_exp(3.0f, 3.0f), 1.0f);
  EXPECT_NEAR(math::softmax_shifted_exp(2.0f, 3.0f), std::exp(-1.0), 1e-7);
  EXPECT_EQ(math::softmax_normalize(1.5f, 6.0), 0.25f);
  EXPECT_NEAR(math::softmax_cross_entropy_row(2.0, 1.5f, 0.5f), std::log(2.0) + 1.0, 1e-12);

  const float logits[3] = {1.0f, 2.0f, 3.0f};
  const double total = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  for (int label = 0; label < 3; ++label) {
    float p[3];
    const double loss = row_loss(logits, 3, label, p);
    EXPECT_NEAR(loss, std::log(total) - logits[label], 1e-6) << "label " << label;
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(p[c], std::exp(static_cast<double>(logits[c])) / total, 1e-7);
  }
}

// Shifting by the row maximum: logits far beyond exp's float range give finite, exact answers.
TEST(KernelMath, SoftmaxCrossEntropyIsStableForHugeLogits) {
  const float logits[3] = {1000.0f, 0.0f, -1000.0f};
  float p[3];
  EXPECT_EQ(row_loss(logits, 3, 0, p), 0.0);
  EXPECT_EQ(p[0], 1.0f);
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_EQ(p[2], 0.0f);
  EXPECT_EQ(row_loss(logits, 3, 1, p), 1000.0);
  EXPECT_EQ(row_loss(logits, 3, 2, p), 2000.0);
}

// d (mean over the batch of the row losses) / d logit = (p - onehot) * dloss / B, against central
// differences of the closed-form loss in double.
TEST(KernelMath, SoftmaxCrossEntropyGradMatchesCentralDifferences) {
  constexpr int kBatch = 3, kClasses = 4;
  const int labels[kBatch] = {2, 0, 3};
  float logits[kBatch * kClasses];
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> unit(-2.0f, 2.0f);
  for (float& logit : logits) logit = unit(rng);
  const float dloss = 1.5f, scale = dloss / kBatch;

  auto mean_loss = [&](int at, double value) {
    double total = 0.0;
    for (int b = 0; b < kBatch; ++b) {
      double sum = 0.0;
      for (int c = 0; c < kClasses; ++c)
        sum += std::exp(b * kClasses + c == at ? value : static_cast<double>(logits[b * kClasses + c]));
      const int label_at = b * kClasses + labels[b];
      total += std::log(sum) - (label_at == at ? value : static_cast<double>(logits[label_at]));
    }
    return dloss * total / kBatch;
  };
  for (int b = 0; b < kBatch; ++b) {
    float p[kClasses];
    row_loss(logits + b * kClasses, kClasses, labels[b], p);
    double row_sum = 0.0;
    for (int c = 0; c < kClasses; ++c) {
      const int at = b * kClasses + c;
      const float analytic = math::softmax_cross_entropy_grad(p[c], c == labels[b], scale);
      const double numeric = derivative([&](double value) { return mean_loss(at, value); }, logits[at]);
      EXPECT_NEAR(analytic, numeric, 1e-6) << "row " << b << ", class " << c;
      row_sum += analytic;
    }
    EXPECT_NEAR(row_sum, 0.0, 1e-6) << "a row's gradients sum to zero; row " << b;
  }
}

// ---- max-pool window ---------------------------------------------------------------------------

PoolGeometry pool(int64_t height, int64_t width, int64_t kernel, int64_t stride) {
  PoolGeometry g;
  g.planes = 1;
  g.height = height;
  g.width = width;
  g.kernel = kernel;
  g.stride = stride;
  g.out_h = (height - kernel) / stride + 1;
  g.out_w = (width - kernel) / stride + 1;
  return g;
}

const float kPlane[16] = {
    1, 5, 2, 0,  //
    3, 4, 8, 8,  //
    9, 9, 1, 2,  //
    0, 9, 3, 7,  //
};

TEST(KernelMath, MaxPoolArgmaxTakesTheFirstMaximumInRowMajorOrder) {
  const PoolGeometry g = pool(4, 4, 2, 2);
  EXPECT_EQ(g.plane(), 16);
  EXPECT_EQ(g.out_plane(), 4);
  EXPECT_EQ(math::max_pool_argmax(kPlane, g, 0, 0), 1);
  EXPECT_EQ(math::max_pool_argmax(kPlane, g, 0, 1), 6);   // 8 at 6 and 7: the first
  EXPECT_EQ(math::max_pool_argmax(kPlane, g, 1, 0), 8);   // 9 at 8, 9 and 13: the first
  EXPECT_EQ(math::max_pool_argmax(kPlane, g, 1, 1), 15);
}

TEST(KernelMath, MaxPoolArgmaxOverlappingWindows) {
  const PoolGeometry g = pool(4, 4, 3, 1);
  EXPECT_EQ(math::max_pool_argmax(kPlane, g, 0, 0), 8);
  EXPECT_EQ(math::max_pool_argmax(kPlane, g, 0, 1), 9);
  EXPECT_EQ(math::max_pool_argmax(kPlane, g, 1, 0), 8);
  EXPECT_EQ(math::max_pool_argmax(kPlane, g, 1, 1), 9);   // 9 at 9 and 13: the first
}

TEST(KernelMath, MaxPoolArgmaxOfNegativeWindows) {
  const float plane[4] = {-5.0f, -3.0f, -4.0f, -7.0f};  // no zero to fall back on
  EXPECT_EQ(math::max_pool_argmax(plane, pool(2, 2, 2, 2), 0, 0), 1);
}

// A NaN anywhere in a window passes through (as relu's does), not only in the window's first
// element: `NaN > x` is false, so a plain comparison would hide it behind any number.
TEST(KernelMath, MaxPoolArgmaxLetsANaNThrough) {
  const PoolGeometry g = pool(2, 2, 2, 2);
  for (int at = 0; at < 4; ++at) {
    float plane[4] = {1.0f, 7.0f, -2.0f, 3.0f};
    plane[at] = kNaN;
    EXPECT_EQ(math::max_pool_argmax(plane, g, 0, 0), at) << "NaN at " << at;
  }
  const float two_nans[4] = {1.0f, kNaN, 9.0f, kNaN};
  EXPECT_EQ(math::max_pool_argmax(two_nans, g, 0, 0), 1);  // the first NaN
}

// The bias corrections are computed once per update, in double: at step 1 they undo (1 - beta),
// and late in training they tend to 1.
TEST(KernelMath, AdamCorrectionMatchesItsClosedForm) {
  for (float step : {1.0f, 2.0f, 10.0f, 1000.0f, 1e6f}) {
    const math::AdamCorrection c = math::adam_correction(kBeta1, kBeta2, step);
    EXPECT_NEAR(c.first, 1.0 / (1.0 - std::pow(static_cast<double>(kBeta1), step)), 1e-6 * c.first) << step;
    EXPECT_NEAR(c.second, 1.0 / (1.0 - std::pow(static_cast<double>(kBeta2), step)), 1e-6 * c.second) << step;
  }
  // 0.999f is 0.99900001287: step 1's second correction is 1000.0129, not 1000 (the loop above
  // compares with the float beta the kernel gets).
  EXPECT_NEAR(math::adam_correction(kBeta1, kBeta2, 1.0f).second, 1000.0, 0.02);
  EXPECT_NEAR(math::adam_correction(kBeta1, kBeta2, 1e6f).second, 1.0, 1e-6);
}

}  // namespace
}  // namespace quiver
