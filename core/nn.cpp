#include "core/nn.h"

#include <cmath>
#include <initializer_list>

#include "core/error.h"
#include "core/op.h"

namespace quiver {

namespace {

// Parameters and nodes of a module are named "<module>/<what>".
struct Scope {
  Scope(GraphBuilder& builder, const std::string& name) : builder(builder), active(!name.empty()) {
    if (active) builder.push_scope(name);
  }
  ~Scope() {
    if (active) builder.pop_scope();
  }
  GraphBuilder& builder;
  bool active;
};

struct LayerParamInits {
  ParamInit weight, bias;
};

// The product of a module's extents (a weight's fan-in, an LSTM's 4H), each >= 1: refused naming
// the module where one is not, or where the product overflows, before any shape is made of it.
int64_t checked_product(const std::string& module, const char* what, std::initializer_list<int64_t> extents) {
  int64_t product = 1;
  for (int64_t extent : extents)
    if (extent < 1 || __builtin_mul_overflow(product, extent, &product))
      throw Error(cat("module '", module, "': ", what, " needs extents >= 1 whose product fits in 64 bits"));
  return product;
}

// A layer checks everything before it adds anything: one refused halfway would leave its first
// parameters in the graph, and a corrected retry would find them "defined twice". First its own
// extents (checked_product), then its input's layout (this, for the message a wrong input gets),
// then its main node as apply() would infer it (GraphBuilder::infer: the op's own refusals, a
// kernel that does not fit the plane, a stride of 0). Returns the input's type.
TensorType check_layer_input(const GraphBuilder& builder, Value x, const std::string& module, int rank, int axis,
                             int64_t extent, const char* layout, const char* option) {
  const Graph& graph = builder.graph();
  const ValueInfo& info = graph.value(graph.id_of(x, cat("module '", module, "': input")));
  if (info.shape.rank() != rank || info.shape[axis] != extent)
    throw Error(cat("module '", module, "': input of shape ", info.shape.str(), "; expected ", layout, " with ",
                    option, " = ", extent));
  return {info.shape, info.dtype};
}

LayerParamInits layer_param_inits(LayerInit init, int64_t fan_in) {
  if (init == LayerInit::torch_default)
    return {ParamInit::fan_in_uniform(fan_in), ParamInit::fan_in_uniform(fan_in)};
  return {ParamInit::he_uniform(fan_in), ParamInit::zeros()};
}

}  // namespace

Value Linear::forward(GraphBuilder& builder, Value x) {
  checked_product(name(), "the weight in_features x out_features", {options_.in_features, options_.out_features});
  const TensorType input = check_layer_input(builder, x, name(), 2, 1, options_.in_features, "(batch, features)",
                                             "features = in_features");
  Scope scope(builder, name());
  builder.infer("matmul", {input, {Shape{options_.in_features, options_.out_features}}}, matmul_attrs(false, false),
                "matmul");
  LayerParamInits init = layer_param_inits(options_.init_, options_.in_features);
  Value weight =
      builder.parameter("weight", Shape{options_.in_features, options_.out_features}, init.weight);
  Value y = builder.matmul(x, weight, false, false, "matmul");
  if (!options_.with_bias) return y;
  Value bias = builder.parameter("bias", Shape{options_.out_features}, init.bias);
  return builder.bias_add(y, bias, "bias_add");
}

Value Conv2d::forward(GraphBuilder& builder, Value x) {
  const Conv2dOptions& o = options_;
  LayerParamInits init =
      layer_param_inits(o.init_, checked_product(name(), "the fan-in in_channels x kernel x kernel",
                                                 {o.in_channels, o.kernel_size, o.kernel_size}));
  checked_product(name(), "the weight out_channels x in_channels x kernel x kernel",
                  {o.out_channels, o.in_channels, o.kernel_size, o.kernel_size});
  const TensorType input = check_layer_input(builder, x, name(), 4, 1, o.in_channels,
                                             "(batch, channels, height, width)", "channels = in_channels");
  Scope scope(builder, name());
  const Shape weight_shape{o.out_channels, o.in_channels, o.kernel_size, o.kernel_size};
  const Conv2dAttrs conv{o.stride_, o.padding_};
  builder.infer("conv2d", {input, {weight_shape}}, conv2d_attrs(conv), "conv");
  Value weight = builder.parameter("weight", weight_shape, init.weight);
  Value y = builder.conv2d(x, weight, conv, "conv");
  if (!o.with_bias) return y;
  Value bias = builder.parameter("bias", Shape{o.out_channels}, init.bias);
  return builder.bias_add(y, bias, "bias_add");
}

Value MaxPool2d::forward(GraphBuilder& builder, Value x) {
  return builder.max_pool2d(x, kernel_, stride_, name());
}

Value ReLU::forward(GraphBuilder& builder, Value x) { return builder.relu(x, name()); }

Value Flatten::forward(GraphBuilder& builder, Value x) { return builder.flatten(x, name()); }

Value LSTM::forward(GraphBuilder& builder, Value x) {
  const int64_t input = options_.input_size, hidden = options_.hidden_size;
  const int64_t gates = checked_product(name(), "the gates' width 4 x hidden_size", {4, hidden});
  checked_product(name(), "the input weight input_size x 4 x hidden_size", {input, gates});
  const TensorType sequence =
      check_layer_input(builder, x, name(), 3, 2, input, "(batch, steps, features)", "features = input_size");
  Scope scope(builder, name());
  builder.infer("lstm", {sequence, {Shape{input, gates}}, {Shape{hidden, gates}}, {Shape{gates}}}, {}, "cell");
  ParamInit init = ParamInit::uniform(1.0 / std::sqrt(static_cast<double>(hidden)));
  Value wx = builder.parameter("wx", Shape{input, gates}, init);
  Value wh = builder.parameter("wh", Shape{hidden, gates}, init);
  // PyTorch's LSTM adds two biases (input and hidden), each U(-k, k); one bias drawn as their
  // sum starts from the same distribution.
  Value bias = builder.parameter("bias", Shape{gates}, ParamInit::uniform(init.bound, 2));
  return builder.lstm(x, wx, wh, bias, "cell");
}

Value LastStep::forward(GraphBuilder& builder, Value x) {
  return builder.select_step(x, -1, name());
}

Value Sequential::forward(GraphBuilder& builder, Value x) {
  Scope scope(builder, name());
  for (const auto& layer : layers_) x = layer->forward(builder, x);
  return x;
}

}  // namespace quiver
