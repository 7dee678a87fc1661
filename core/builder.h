// GraphBuilder: the public model-building API. Each call appends a node, infers its output shapes
// through the op's registered OpDef, and returns the output values; a shape mismatch throws
// quiver::Error naming the op, the node and the shapes. Typed methods are conveniences over
// apply(), which builds any registered op by kind.
#pragma once

#include <string>
#include <vector>

#include "core/graph.h"

namespace quiver {

struct OpDef;
struct TensorType;

struct Conv2dAttrs {
  int64_t stride = 1;
  int64_t padding = 0;
};

// The attributes conv2d() and matmul() give their nodes (for GraphBuilder::infer).
Attrs conv2d_attrs(Conv2dAttrs conv);
Attrs matmul_attrs(bool trans_a, bool trans_b);

class GraphBuilder {
 public:
  GraphBuilder() = default;
  // Goes on building `graph`; unnamed nodes are numbered past any it has already.
  explicit GraphBuilder(Graph graph) : graph_(std::move(graph)), unnamed_(static_cast<int>(graph_.nodes().size())) {}

  Graph& graph() { return graph_; }
  const Graph& graph() const { return graph_; }
  // A copy: a reference into the graph would dangle once the graph grows.
  Shape shape(Value value) const { return graph_.value(graph_.id_of(value, "shape")).shape; }

  Value input(const std::string& name, const Shape& shape, DType dtype = DType::F32);
  Value parameter(const std::string& name, const Shape& shape, ParamInit init);
  // Optimizer state for parameter `param_index` ("velocity", "adam_m"), same shape as it; the
  // same value each time it is asked for.
  Value state(int param_index, const std::string& kind);

  // Any registered op. `name` defaults to "<op>_<n>"; the current scope prefixes it.
  std::vector<Value> apply(const std::string& op, const std::vector<Value>& inputs,
                           Attrs attrs = {}, const std::string& name = "",
                           std::vector<NodeId> control_inputs = {});
  Value apply1(const std::string& op, const std::vector<Value>& inputs, Attrs attrs = {},
               const std::string& name = "");
  // What apply() would infer for op `op` over inputs of these types, named `name` in the current
  // scope, without adding anything: the op's own refusal, named as apply() names it. A layer
  // checks the node it will make this way before adding its parameters.
  std::vector<TensorType> infer(const std::string& op, const std::vector<TensorType>& inputs, Attrs attrs,
                                const std::string& name) const;

  // (M, K) x (K, N) -> (M, N), with optional transposes of either side.
  Value matmul(Value a, Value b, bool trans_a = false, bool trans_b = false,
               const std::string& name = "");
  // The name alone, third as every other op takes it: without this overload a string literal
  // there would convert to bool and silently mean trans_a = true.
  Value matmul(Value a, Value b, const char* name) { return matmul(a, b, false, false, name ? name : ""); }
  Value matmul(Value a, Value b, const std::string& name) { return matmul(a, b, false, false, name); }
  // x (B, C, ...) + bias (C): broadcast along axis 1.
  Value bias_add(Value x, Value bias, const std::string& name = "");
  Value add(Value a, Value b, const std::string& name = "");
  Value mul(Value a, Value b, const std::string& name = "");
  Value relu(Value x, const std::string& name = "");
  Value sigmoid(Value x, const std::string& name = "");
  Value tanh(Value x, const std::string& name = "");
  // x (B, C, H, W), w (O, C, KH, KW) -> (B, O, OH, OW).
  Value conv2d(Value x, Value w, Conv2dAttrs attrs = {}, const std::string& name = "");
  Value max_pool2d(Value x, int64_t kernel, int64_t stride = 0, const std::string& name = "");  // stride 0: kernel
  Value reshape(Value x, const Shape& shape, const std::string& name = "");
  Value flatten(Value x, const std::string& name = "");  // (B, ...) -> (B, rest)
  // Mean softmax cross-entropy of logits (B, C) against int32 labels (B): a scalar.
  Value softmax_cross_entropy(Value logits, Value labels, const std::string& name = "");
  // One LSTM layer over x (B, T, I) with wx (I, 4H), wh (H, 4H), b (4H); gates i, f, g, o.
  // Returns every step's hidden state (B, T, H).
  Value lstm(Value x, Value wx, Value wh, Value b, const std::string& name = "");
  Value select_step(Value x, int64_t step, const std::string& name = "");  // (B,T,H) -> (B,H)
  Value fill(const Shape& shape, double value, const std::string& name = "");

  void push_scope(const std::string& scope) { scopes_.push_back(scope); }
  void pop_scope();  // throws quiver::Error when no scope is open
  std::string scoped(const std::string& name) const;

 private:
  void add_update_order(const OpDef& def, Node& node) const;
  // `def`'s output types for `node` over `inputs`, every error naming the op, the node and the
  // input shapes, and every output's extents checked.
  std::vector<TensorType> infer_outputs(const OpDef& def, const Node& node, std::vector<TensorType> inputs) const;

  Graph graph_;
  std::vector<std::string> scopes_;
  int unnamed_ = 0;
};

}  // namespace quiver
