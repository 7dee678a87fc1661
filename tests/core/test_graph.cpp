// Builder and autodiff behaviour: clear errors on bad graphs, gradient accumulation of values
// read twice, parameter naming, and the memory plan reusing activation buffers.
#include <gtest/gtest.h>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/nn.h"
#include "runtime/param_store.h"
#include "runtime/plan.h"

namespace quiver {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(Builder, MatmulShapeMismatchNamesOpNodeAndBothShapes) {
  GraphBuilder b;
  Value x = b.input("x", Shape{64, 512});
  Value w = b.parameter("w", Shape{256, 10}, ParamInit::zeros());
  std::string message = error_of([&] { b.matmul(x, w, false, false, "fc2"); });
  EXPECT_NE(message.find("matmul"), std::string::npos) << message;
  EXPECT_NE(message.find("'fc2'"), std::string::npos) << message;
  EXPECT_NE(message.find("[64,512]"), std::string::npos) << message;
  EXPECT_NE(message.find("[256,10]"), std::string::npos) << message;
}

TEST(Builder, ConvChannelMismatchNamesTheNode) {
  GraphBuilder b;
  Value x = b.input("x", Shape{2, 3, 8, 8});
  Value w = b.parameter("w", Shape{4, 2, 3, 3}, ParamInit::zeros());
  std::string message = error_of([&] { b.conv2d(x, w, {}, "conv1"); });
  EXPECT_NE(message.find("conv2d 'conv1'"), std::string::npos) << message;
  EXPECT_NE(message.find("[2,3,8,8]"), std::string::npos) << message;
  EXPECT_NE(message.find("[4,2,3,3]"), std::string::npos) << message;
}

TEST(Builder, OtherMalformedGraphsAreRejected) {
  GraphBuilder b;
  Value x = b.input("x", Shape{4, 6});
  EXPECT_THROW(b.add(x, b.input("y", Shape{4, 5})), Error);
  EXPECT_THROW(b.reshape(x, Shape{5, 5}), Error);
  EXPECT_THROW(b.input("x", Shape{1}), Error);                  // defined twice
  EXPECT_THROW(b.apply1("no_such_op", {x}), Error);
  EXPECT_THROW(b.relu(Value{999}), Error);
  Value labels = b.input("labels", Shape{4}, DType::F32);        // must be int32
  EXPECT_THROW(b.softmax_cross_entropy(x, labels), Error);
  Value loss_like = b.relu(x);
  EXPECT_THROW(build_backward(b, loss_like), Error);             // not a scalar
}

TEST(Autodiff, GradientsOfValuesReadTwiceAreSummed) {
  // loss = sum((w * w) * R): d/dw = 2 w R, built from two contributions of w.
  GraphBuilder b;
  Value w = b.parameter("w", Shape{1, 3}, ParamInit::zeros());
  Value r = b.input("R", Shape{3, 1});
  Value loss = b.reshape(b.matmul(b.mul(w, w), r), Shape{});
  build_backward(b, loss);
  ParamStore store(b.graph());
  const float values[3] = {1.0f, -2.0f, 0.5f}, weights[3] = {3.0f, 1.0f, -4.0f};
  std::copy_n(values, 3, store.param(0).f32());
  Plan plan(b.graph(), store, {loss, Value{b.graph().params()[0].grad}});
  std::copy_n(weights, 3, plan.input("R").f32());
  plan.run();
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(store.grad(0).f32()[i], 2 * values[i] * weights[i]);
}

TEST(Modules, ParametersAreNamedByModule) {
  GraphBuilder b;
  Sequential net;
  net.add<Linear>("fc1", LinearOptions(4, 3)).add<ReLU>("relu").add<Linear>("fc2", LinearOptions(3, 2).bias(false));
  Value y = net.forward(b, b.input("x", Shape{5, 4}));
  EXPECT_EQ(b.shape(y), (Shape{5, 2}));
  std::vector<std::string> names;
  for (const ParamInfo& p : b.graph().params()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"fc1/weight", "fc1/bias", "fc2/weight"}));
}

TEST(Plan, ActivationBuffersAreReused) {
  // A chain of 20 relus needs two live buffers at a time, not twenty.
  GraphBuilder b;
  Value x = b.input("x", Shape{256, 256});
  Value y = x;
  for (int i = 0; i < 20; ++i) y = b.relu(y);
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {y});
  EXPECT_LE(plan.activation_bytes(), 3 * 256 * 256 * 4);
  plan.input("x").fill(-1.0f);
  plan.input("x").f32()[7] = 2.0f;
  plan.run();
  EXPECT_FLOAT_EQ(plan.tensor(y).f32()[7], 2.0f);
  EXPECT_FLOAT_EQ(plan.tensor(y).f32()[8], 0.0f);
}

TEST(ParamStore, InitialisationDependsOnlyOnSeedAndName) {
  GraphBuilder b;
  b.parameter("a", Shape{10}, ParamInit::uniform(0.5));
  b.parameter("b", Shape{10}, ParamInit::uniform(0.5));
  ParamStore one(b.graph()), two(b.graph());
  one.initialize(3);
  two.initialize(3);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(one.param(1).f32()[i], two.param(1).f32()[i]);
    EXPECT_LE(std::abs(one.param(0).f32()[i]), 0.5f);
  }
  two.initialize(4);
  EXPECT_NE(one.param(0).f32()[0], two.param(0).f32()[0]);
  // Flat buffers: every parameter is a view into one allocation.
  EXPECT_EQ(one.param(0).storage(), one.param(1).storage());
}

}  // namespace
}  // namespace quiver
