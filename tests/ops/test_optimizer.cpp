// Optimizer update ops against their closed forms, over several steps, on flat-buffer slices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/autodiff.h"
#include "core/error.h"
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

// Hyperparameters that would divide by zero or never decay are refused when the updates are
// added, naming the option; the update inputs must be float32 (an int32 learning rate of 1 would
// otherwise be read as 1e-45 and training would silently stand still).
TEST(Optimizer, BadHyperparametersAndInputTypesAreRefused) {
  auto built = [](auto add) {
    GraphBuilder b;
    Value w = b.parameter("w", Shape{1, 5}, ParamInit::zeros());
    Value loss = b.reshape(b.matmul(w, b.input("R", Shape{5, 1})), Shape{});
    build_backward(b, loss);
    try {
      add(b);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  auto adam_with = [&](auto change) {
    return built([&](GraphBuilder& b) {
      AdamOptions options;
      change(options);
      add_adam_update(b, b.input("lr", Shape{1}), b.input("step", Shape{1}), options);
    });
  };
  EXPECT_NE(adam_with([](AdamOptions& o) { o.beta1 = 1.0; }).find("beta1 must be in [0, 1), got 1"), std::string::npos);
  EXPECT_NE(adam_with([](AdamOptions& o) { o.beta2 = -0.5; }).find("beta2"), std::string::npos);
  EXPECT_NE(adam_with([](AdamOptions& o) { o.epsilon = 0.0; }).find("epsilon"), std::string::npos);
  // Fractions below 1 as doubles that are 1 as floats: Adam's bias correction would divide by 0.
  EXPECT_NE(adam_with([](AdamOptions& o) { o.beta2 = 0.99999999; }).find("beta2 0.99999999 rounds to 1"),
            std::string::npos);
  EXPECT_NE(adam_with([](AdamOptions& o) { o.beta1 = 1e-40; }).find("beta1 1e-40 is below the smallest normal"),
            std::string::npos);
  EXPECT_NE(adam_with([](AdamOptions& o) { o.epsilon = 1e-40; }).find("epsilon must be in a 32-bit float's normal range"),
            std::string::npos);
  EXPECT_EQ(adam_with([](AdamOptions& o) { o.beta2 = 0.99999994; }), "");
  EXPECT_NE(adam_with([](AdamOptions& o) { o.weight_decay = std::nan(""); }).find("weight decay"), std::string::npos);
  EXPECT_EQ(adam_with([](AdamOptions&) {}), "");
  EXPECT_NE(built([](GraphBuilder& b) { add_sgd_update(b, b.input("lr", Shape{1}), SgdOptions{1.0, 0.0}); })
                .find("momentum must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(built([](GraphBuilder& b) { add_sgd_update(b, b.input("lr", Shape{1}), SgdOptions{0.99999999, 0.0}); })
                .find("momentum 0.99999999 rounds to 1"),
            std::string::npos);
  EXPECT_NE(built([](GraphBuilder& b) { add_sgd_update(b, b.input("lr", Shape{1}), SgdOptions{0.9, -1.0}); })
                .find("weight decay"),
            std::string::npos);
  const std::string int_rate = built([](GraphBuilder& b) {
    add_sgd_update(b, b.input("lr", Shape{1}, DType::I32), SgdOptions{});
  });
  EXPECT_NE(int_rate.find("sgd_update 'w/update'"), std::string::npos) << int_rate;
  EXPECT_NE(int_rate.find("i32"), std::string::npos) << int_rate;
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

// An update built by hand with apply() gets the order add_sgd_update gives: it runs after every
// reader of what it writes (a concurrent executor once ran such an update before the forward
// matmul read w). What it writes besides the parameter must be that parameter's state, given once.
TEST(Optimizer, AHandBuiltUpdateRunsAfterTheReadersAndWritesOnlyItsState) {
  GraphBuilder b;
  Value w = b.parameter("w", Shape{1, 5}, ParamInit::zeros());
  Value u = b.parameter("u", Shape{1, 5}, ParamInit::zeros());
  Value r = b.input("R", Shape{5, 1});
  Value loss = b.reshape(b.add(b.matmul(w, r, false, false, "forward"), b.matmul(u, r)), Shape{});
  build_backward(b, loss);
  Value lr = b.input("learning_rate", Shape{1});
  Value grad = b.graph().handle(b.graph().params()[0].grad);
  const Attrs sgd = Attrs().set("momentum", 0.9).set("weight_decay", 0.0);
  auto refused = [&](const std::vector<Value>& inputs, const std::string& expected) {
    const size_t nodes = b.graph().nodes().size();
    try {
      b.apply("sgd_update", inputs, sgd, "w/update");
      ADD_FAILURE() << "accepted: " << expected;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
    EXPECT_EQ(b.graph().nodes().size(), nodes) << "a refused update adds nothing";
  };
  refused({w, grad, r, lr}, "sgd_update 'w/update': updates input 2 ('R') in place, which must be optimizer state of 'w'");
  refused({w, grad, w, lr}, "'w' is input 0, which it updates in place, and input 2 too");
  refused({w, grad, grad, lr}, "updates input 2 (");
  refused({w, grad, b.state(1, "velocity"), lr}, "updates input 2 ('u/velocity') in place, which must be optimizer state of 'w'");
  Value velocity = b.state(0, "velocity");
  refused({w, grad, velocity, velocity}, "'w/velocity' is input 2, which it updates in place, and input 3 too");

  b.apply("sgd_update", {w, grad, velocity, lr}, sgd, "w/update");
  const Graph& graph = b.graph();
  const Node& update = graph.nodes().back();
  ASSERT_EQ(update.op, "sgd_update");
  int readers = 0;
  for (NodeId reader : graph.consumers(w.id)) {
    if (reader == update.id) continue;
    ++readers;
    EXPECT_NE(std::find(update.control_inputs.begin(), update.control_inputs.end(), reader),
              update.control_inputs.end()) << graph.node(reader).name << " may run after the update";
  }
  EXPECT_GE(readers, 1) << "the forward matmul reads w: there is an order to check";
}

// The update runs after the readers it knows when it is added: a reader of the parameter (or of its
// state) added later would race with it, a second update would apply twice, and an update of a
// batch or an activation writes what is not a parameter. All refused, naming the node.
TEST(Optimizer, NoReaderOrUpdateOfAParameterAfterItsUpdate) {
  auto refused = [](const std::function<void(LinearLoss&)>& late, const std::string& expected) {
    LinearLoss problem("sgd");
    try {
      late(problem);
      ADD_FAILURE() << "accepted: " << expected;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  };
  refused([](LinearLoss& p) { p.builder.matmul(p.w, p.r, false, false, "late_reader"); },
          "matmul 'late_reader': reads 'w', which 'w/update' already updates in place");
  refused([](LinearLoss& p) { p.builder.relu(p.builder.graph().handle(p.builder.graph().params()[0].value), "late"); },
          "relu 'late': reads 'w'");
  refused(
      [](LinearLoss& p) {
        Graph& g = p.builder.graph();
        p.builder.apply("sgd_update", {g.handle(g.params()[0].value), g.handle(g.params()[0].grad),
                                       p.builder.state(0, "velocity"), p.lr},
                        Attrs().set("momentum", 0.9).set("weight_decay", 0.0), "again");
      },
      "sgd_update 'again': reads 'w', which 'w/update' already updates in place");
  refused(
      [](LinearLoss& p) {
        Graph& g = p.builder.graph();
        // A state no update writes yet (state(0, "velocity") is w/update's own, refused for that).
        p.builder.apply("sgd_update", {p.r, g.handle(g.params()[0].grad), p.builder.state(0, "spare"), p.lr},
                        Attrs().set("momentum", 0.9).set("weight_decay", 0.0), "of_a_batch");
      },
      "sgd_update 'of_a_batch': updates its first input in place, which must be a parameter");
}

// The learning rate and Adam's step are inputs fed each step: a parameter (which the update would
// also train) or an activation is refused.
TEST(Optimizer, TheLearningRateAndStepAreInputs) {
  for (const char* optimizer : {"sgd", "adam"}) {
    SCOPED_TRACE(optimizer);
    GraphBuilder b;
    Value w = b.parameter("w", Shape{1, 5}, ParamInit::zeros());
    Value rate = b.parameter("rate", Shape{1}, ParamInit::zeros());
    Value loss = b.reshape(b.matmul(w, b.input("R", Shape{5, 1})), Shape{});
    build_backward(b, loss);
    try {
      if (std::string(optimizer) == "sgd")
        add_sgd_update(b, rate, SgdOptions{});
      else
        add_adam_update(b, b.input("learning_rate", Shape{1}), b.relu(rate), AdamOptions{});
      ADD_FAILURE() << "accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("must be an input of one value, fed each step"), std::string::npos)
          << error.what();
    }
  }
}

// A product's gradient is built only for the factors that need one: x * s with x a batch and s a
// parameter has no gradient for x, which would read s every step for nothing (as a reader of s,
// the update waits for it, so the plan ran it).
TEST(Optimizer, AProductBuildsOnlyTheGradientsItNeeds) {
  GraphBuilder b;
  Value x = b.input("x", Shape{4, 3});
  Value scale = b.parameter("scale", Shape{4, 3}, ParamInit::zeros());
  Value loss = b.reshape(b.matmul(b.mul(x, scale, "gate"), b.input("R", Shape{3, 1})), Shape{4});
  loss = b.reshape(b.matmul(b.input("ones", Shape{1, 4}), b.reshape(loss, Shape{4, 1})), Shape{});
  build_backward(b, loss);
  add_sgd_update(b, b.input("learning_rate", Shape{1}), SgdOptions{});
  std::vector<std::string> names;
  for (const Node& node : b.graph().nodes()) names.push_back(node.name);
  EXPECT_NE(std::find(names.begin(), names.end(), "gate/grad/rhs"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "gate/grad/lhs"), names.end());
}

}  // namespace
}  // namespace quiver
