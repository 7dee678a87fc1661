// The bundled models are the ones DESIGN.md section 4 describes: their layers in order (the ops
// and their attributes), their parameters (names, shapes, totals), their logits' shape, and a
// clear error for a model that does not exist.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "models/models.h"
#include "runtime/param_store.h"
#include "runtime/plan.h"

namespace quiver {

void PrintTo(const Shape& shape, std::ostream* out) { *out << shape.str(); }  // gtest's messages

namespace {

struct Built {
  GraphBuilder builder;
  Value logits;
  std::map<std::string, Shape> params;
  int64_t total = 0;
};

std::unique_ptr<Built> build(const ModelSpec& model, int64_t batch) {
  auto built = std::make_unique<Built>();
  std::vector<int64_t> dims{batch};
  for (int64_t d : model.sample_shape.dims()) dims.push_back(d);
  built->logits = model.build(built->builder, built->builder.input("x", Shape(dims)));
  const Graph& graph = built->builder.graph();
  for (const ParamInfo& param : graph.params()) {
    const Shape& shape = graph.value(param.value).shape;
    built->params.emplace(param.name, shape);
    built->total += shape.numel();
  }
  return built;
}

using Layout = std::map<std::string, Shape>;

// The forward graph's nodes in order, as "op name" plus the attributes that define a layer
// (a convolution's stride and padding, a pool's window, the step an LSTM's output is read at).
// The parameter shapes alone would not notice a dropped ReLU (three Linear layers with nothing
// between them are one affine map) or a pool that moved.
std::vector<std::string> layers(const Built& built) {
  std::vector<std::string> out;
  for (const Node& node : built.builder.graph().nodes()) {
    std::string attrs;
    for (const char* key : {"stride", "pad", "padding", "kernel", "step"})
      if (node.attrs.has(key)) attrs += cat(" ", key, "=", node.attrs.get_int(key));
    out.push_back(cat(node.op, " ", node.name, attrs));
  }
  return out;
}

TEST(Models, MlpIs784To512To256To10) {
  const auto mlp = build(models::mlp(), 3);
  EXPECT_EQ(mlp->builder.shape(mlp->logits), (Shape{3, 10}));
  EXPECT_EQ(mlp->params, (Layout{{"fc1/weight", Shape{784, 512}}, {"fc1/bias", Shape{512}},
                                 {"fc2/weight", Shape{512, 256}}, {"fc2/bias", Shape{256}},
                                 {"fc3/weight", Shape{256, 10}}, {"fc3/bias", Shape{10}}}));
  EXPECT_EQ(mlp->total, 535818);
  EXPECT_EQ(layers(*mlp), (std::vector<std::string>{"matmul fc1/matmul", "bias_add fc1/bias_add", "relu relu1",
                                                     "matmul fc2/matmul", "bias_add fc2/bias_add", "relu relu2",
                                                     "matmul fc3/matmul", "bias_add fc3/bias_add"}));
}

TEST(Models, CnnIsTwoConvPoolBlocksAndTwoLinearLayers) {
  const auto cnn = build(models::cnn(), 2);
  EXPECT_EQ(cnn->builder.shape(cnn->logits), (Shape{2, 10}));
  EXPECT_EQ(cnn->params.at("conv1/weight"), (Shape{16, 1, 5, 5}));
  EXPECT_EQ(cnn->params.at("conv2/weight"), (Shape{32, 16, 5, 5}));
  EXPECT_EQ(cnn->params.at("fc1/weight"), (Shape{1568, 128}));
  EXPECT_EQ(cnn->params.at("fc2/weight"), (Shape{128, 10}));
  EXPECT_EQ(cnn->params.size(), 8u);  // and a bias each
  EXPECT_EQ(cnn->total, 215370);
  // DESIGN.md: conv5x5 1->16 pad 2, ReLU, maxpool 2; conv5x5 16->32 pad 2, ReLU, maxpool 2;
  // flatten 1568 -> 128 -> ReLU -> 10.
  EXPECT_EQ(layers(*cnn), (std::vector<std::string>{
                              "conv2d conv1/conv stride=1 padding=2", "bias_add conv1/bias_add", "relu relu1",
                              "max_pool2d pool1 stride=2 kernel=2", "conv2d conv2/conv stride=1 padding=2",
                              "bias_add conv2/bias_add", "relu relu2", "max_pool2d pool2 stride=2 kernel=2",
                              "reshape flatten", "matmul fc1/matmul", "bias_add fc1/bias_add", "relu relu3",
                              "matmul fc2/matmul", "bias_add fc2/bias_add"}));
}

TEST(Models, LstmIsOneLayerOfHidden128Over28Steps) {
  const auto lstm = build(models::lstm(), 4);
  EXPECT_EQ(lstm->builder.shape(lstm->logits), (Shape{4, 10}));
  EXPECT_EQ(lstm->params.at("fc/weight"), (Shape{128, 10}));
  // 4 gates x 128 over the 28 inputs and the 128 hidden, one bias per gate unit, then 128 -> 10.
  EXPECT_EQ(lstm->total, 4 * 128 * (28 + 128) + 4 * 128 + 128 * 10 + 10);
  EXPECT_EQ(lstm->total, 81674);
  // The last step's hidden state -> 10.
  EXPECT_EQ(layers(*lstm), (std::vector<std::string>{"lstm lstm/cell", "select_step last step=-1", "matmul fc/matmul",
                                                      "bias_add fc/bias_add"}));
}

// The logits are computed, finite, and differ between samples (the model reads its input).
TEST(Models, LogitsAreFiniteAndDependOnTheSample) {
  for (const std::string& name : models::names()) {
    SCOPED_TRACE(name);
    const ModelSpec model = models::by_name(name);
    const auto built = build(model, 2);
    ParamStore store(built->builder.graph());
    store.initialize(1);
    Plan plan(built->builder.graph(), store, {built->logits});
    const Tensor& x = plan.input("x");
    const int64_t per_sample = model.sample_shape.numel();
    for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = i < per_sample ? 0.0f : 0.5f;
    plan.run();
    const float* logits = plan.tensor(built->logits).f32();
    float difference = 0.0f;
    for (int k = 0; k < 10; ++k) {
      EXPECT_TRUE(std::isfinite(logits[k]) && std::isfinite(logits[10 + k]));
      difference += std::abs(logits[k] - logits[10 + k]);
    }
    EXPECT_GT(difference, 1e-4f);
  }
}

TEST(Models, AnUnknownNameListsTheModels) {
  EXPECT_EQ(models::names(), (std::vector<std::string>{"mlp", "cnn", "lstm"}));
  try {
    models::by_name("resnet");
    FAIL() << "resnet is not a bundled model";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "unknown model 'resnet' (choose mlp, cnn or lstm)");
  }
}

}  // namespace
}  // namespace quiver
