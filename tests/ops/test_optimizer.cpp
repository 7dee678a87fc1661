// Optimizer update ops against their closed forms, over several steps, on flat-buffer slices.
#include <gtest/gtest.h>

#include <cmath>

#include "core/autodiff.h"
#include "runtime/param_store.h"
#include "runtime/plan.h"

namespace quiver {
namespace {

// loss = sum(w * R): d loss / d w = R, a gradient we know exactly.
struct LinearLoss {
  GraphBuilder builder;
  Value w, r, lr, step, loss;
  explicit LinearLoss(const std::string& optimizer) {
    w = builder.parameter("w", Shape{1, 5}, ParamInit::zeros());
    r = builder.input("R", Shape{5, 1});
    loss = builder.reshape(builder.matmul(w, r), Shape{});
    build_backward(builder, loss);
    lr = builder.input("learning_rate", Shape{1});
    if (optimizer == "sgd") {
      add_sgd_update(builder, lr, SgdOptions{0.9, 0.1});
    } else {
      step = builder.input("step", Shape{1});
      AdamOptions adam;
      adam.weight_decay = 0.01;
      add_adam_update(builder, lr, step, adam);
    }
  }
};

const float kInitial[5] = {0.5f, -1.0f, 0.25f, 2.0f, 0.0f};
const float kGradient[5] = {1.0f, -2.0f, 0.5f, 0.0f, 3.0f};

TEST(Optimizer, SgdMomentumWeightDecayMatchesClosedForm) {
  LinearLoss problem("sgd");
  ParamStore store(problem.builder.graph());
  Plan plan(problem.builder.graph(), store, {problem.loss});
  std::copy_n(kInitial, 5, store.param(0).f32());
  std::copy_n(kGradient, 5, plan.input("R").f32());
  plan.input("learning_rate").f32()[0] = 0.1f;
  double w[5], v[5] = {0, 0, 0, 0, 0};
  for (int i = 0; i < 5; ++i) w[i] = kInitial[i];
  for (int step = 0; step < 4; ++step) {
    plan.run();
    for (int i = 0; i < 5; ++i) {
      v[i] = 0.9 * v[i] - 0.1 * (kGradient[i] + 0.1 * w[i]);
      w[i] += v[i];
    }
  }
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(store.param(0).f32()[i], w[i], 1e-5);
    EXPECT_NEAR(store.state("velocity", 0).f32()[i], v[i], 1e-5);
  }
}

TEST(Optimizer, AdamMatchesClosedForm) {
  LinearLoss problem("adam");
  ParamStore store(problem.builder.graph());
  Plan plan(problem.builder.graph(), store, {problem.loss});
  std::copy_n(kInitial, 5, store.param(0).f32());
  std::copy_n(kGradient, 5, plan.input("R").f32());
  plan.input("learning_rate").f32()[0] = 0.01f;
  double w[5], m[5] = {}, v[5] = {};
  for (int i = 0; i < 5; ++i) w[i] = kInitial[i];
  for (int step = 1; step <= 3; ++step) {
    plan.input("step").f32()[0] = static_cast<float>(step);
    plan.run();
    for (int i = 0; i < 5; ++i) {
      double g = kGradient[i] + 0.01 * w[i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      double m_hat = m[i] / (1 - std::pow(0.9, step)), v_hat = v[i] / (1 - std::pow(0.999, step));
      w[i] -= 0.01 * m_hat / (std::sqrt(v_hat) + 1e-8);
    }
  }
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(store.param(0).f32()[i], w[i], 1e-5);
}

TEST(Optimizer, UpdateRunsAfterEveryReaderOfItsParameter) {
  LinearLoss problem("sgd");
  const Graph& graph = problem.builder.graph();
  const Node& update = graph.nodes().back();
  ASSERT_EQ(update.op, "sgd_update");
  int readers = 0;
  for (NodeId reader : graph.consumers(problem.w.id)) {
    if (reader == update.id) continue;
    ++readers;
    EXPECT_NE(std::find(update.control_inputs.begin(), update.control_inputs.end(), reader),
              update.control_inputs.end())
        << graph.node(reader).name;
  }
  EXPECT_GE(readers, 1) << "the forward pass reads w: there is an order to check";
}

}  // namespace
}  // namespace quiver
