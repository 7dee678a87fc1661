#include "core/builder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

#include "core/error.h"
#include "core/op.h"

namespace quiver {

namespace {

// A value's shape: every extent at least 1 and at most 2^59 elements, whose bytes, and the sums
// of several tensors' bytes, stay well within int64 (a negative or zero extent would reach the
// allocator and the kernels as a huge or empty buffer).
void check_extents(const Shape& shape, const std::string& what) {
  constexpr int64_t kMostElements = int64_t{1} << 59;
  int64_t count = 1;
  for (int64_t extent : shape.dims()) {
    if (extent < 1) throw Error(cat(what, " has shape ", shape.str(), ": every extent must be >= 1"));
    if (__builtin_mul_overflow(count, extent, &count) || count > kMostElements)
      throw Error(cat(what, " has shape ", shape.str(), ": more elements than a tensor can hold (2^59)"));
  }
}

}  // namespace

void GraphBuilder::pop_scope() {
  if (scopes_.empty()) throw Error("pop_scope: no scope is open (every pop_scope needs a push_scope before it)");
  scopes_.pop_back();
}

std::string GraphBuilder::scoped(const std::string& name) const {
  std::string full;
  for (const std::string& scope : scopes_) full += scope + "/";
  return full + name;
}

Value GraphBuilder::input(const std::string& name, const Shape& shape, DType dtype) {
  if (graph_.has_name(name)) throw Error(cat("input '", name, "' is defined twice"));
  check_extents(shape, cat("input '", name, "'"));
  ValueInfo info;
  info.name = name;
  info.shape = shape;
  info.dtype = dtype;
  info.role = ValueRole::Input;
  return graph_.handle(graph_.add_value(std::move(info)));
}

Value GraphBuilder::parameter(const std::string& name, const Shape& shape, ParamInit init) {
  std::string full = scoped(name);
  if (graph_.has_name(full)) throw Error(cat("parameter '", full, "' is defined twice"));
  check_extents(shape, cat("parameter '", full, "'"));
  // Each value is a sum of `terms` draws within +-bound, made a float: the sum must fit one, and
  // terms are drawn for every element (a million terms of a large weight would never finish).
  constexpr int kMostTerms = 64;
  if (init.kind == InitKind::Uniform &&
      !(std::isfinite(init.bound) && init.bound >= 0.0 && init.terms >= 1 && init.terms <= kMostTerms &&
        init.bound * init.terms <= std::numeric_limits<float>::max()))
    throw Error(cat("parameter '", full, "': a uniform init needs a finite bound >= 0 and 1 <= terms <= ", kMostTerms,
                    " with bound x terms within float32's range, got bound ", init.bound, " and terms ", init.terms));
  if (std::ranges::any_of(graph_.params(), [](const ParamInfo& param) { return param.grad >= 0; }))
    throw Error(cat("parameter '", full, "': the graph's gradients are built already (build_backward); "
                    "add every parameter before it"));
  ValueInfo info;
  info.name = full;
  info.shape = shape;
  info.role = ValueRole::Parameter;
  info.param_index = static_cast<int>(graph_.params().size());
  ValueId id = graph_.add_value(std::move(info));
  graph_.add_param(ParamInfo{full, id, -1, init});
  return graph_.handle(id);
}

Value GraphBuilder::state(int param_index, const std::string& kind) {
  if (param_index < 0 || param_index >= static_cast<int>(graph_.params().size()))
    throw Error(cat("state '", kind, "': no parameter ", param_index, " (the graph has ", graph_.params().size(), ")"));
  const ParamInfo& param = graph_.params()[static_cast<size_t>(param_index)];
  ValueInfo info;
  info.name = param.name + "/" + kind;
  // The state exists already: the same value again (two values would view one buffer).
  for (const ValueInfo& existing : graph_.values())
    if (existing.role == ValueRole::State && existing.param_index == param_index && existing.state_kind == kind)
      return graph_.handle(existing.id);
  // Looked up by name like inputs and parameters (Graph::find): an input called "w/velocity"
  // would shadow w's momentum.
  if (graph_.has_name(info.name))
    throw Error(cat("state '", info.name, "': the name is taken already (an input or parameter of that name)"));
  info.shape = graph_.value(param.value).shape;
  info.role = ValueRole::State;
  info.param_index = param_index;
  info.state_kind = kind;
  return graph_.handle(graph_.add_value(std::move(info)));
}

// An update's other written inputs are its parameter's optimizer state, each given once; and it
// runs after every node that reads what it writes (a hand-built optimizer gets the same order as
// add_sgd_update's: without it a concurrent executor could update w before the forward pass read it).
void GraphBuilder::add_update_order(const OpDef& def, Node& node) const {
  const ValueInfo& param = graph_.value(node.inputs[0]);
  for (int written : def.written_inputs) {
    if (written >= static_cast<int>(node.inputs.size())) continue;  // too few inputs: infer names it
    const ValueInfo& info = graph_.value(node.inputs[static_cast<size_t>(written)]);
    if (written > 0 && (info.role != ValueRole::State || info.param_index != param.param_index))
      throw Error(cat(node.op, " '", node.name, "': updates input ", written, " ('", info.name, "') in place, which must be ",
                      "optimizer state of '", param.name, "' (GraphBuilder::state)"));
    for (size_t other = 0; other < node.inputs.size(); ++other)
      if (static_cast<int>(other) != written && node.inputs[other] == info.id)
        throw Error(cat(node.op, " '", node.name, "': '", info.name, "' is input ", written, ", which it updates in place, ",
                        "and input ", other, " too"));
    for (NodeId reader : graph_.consumers(info.id))
      if (std::find(node.control_inputs.begin(), node.control_inputs.end(), reader) == node.control_inputs.end())
        node.control_inputs.push_back(reader);
  }
}

std::vector<Value> GraphBuilder::apply(const std::string& op, const std::vector<Value>& inputs,
                                       Attrs attrs, const std::string& name,
                                       std::vector<NodeId> control_inputs) {
  const OpDef& def = OpRegistry::global().get(op);
  Node node;
  node.op = op;
  node.name = scoped(name.empty() ? cat(op, "_", unnamed_++) : name);
  node.attrs = std::move(attrs);
  node.control_inputs = std::move(control_inputs);
  InferContext infer{node, {}};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ValueInfo& info = graph_.value(graph_.id_of(inputs[i], cat(op, " '", node.name, "': input ", i)));
    // A parameter (or its optimizer state) is written in place by its update, which runs after
    // the readers it was given when it was added: a reader added later would race with it (or
    // read the updated value), and a second update would apply twice.
    if (info.role == ValueRole::Parameter || info.role == ValueRole::State)
      for (NodeId reader : graph_.consumers(info.id))
        if (const Node& update = graph_.node(reader); OpRegistry::global().get(update.op).updates_in_place())
          throw Error(cat(op, " '", node.name, "': reads '", info.name, "', which '", update.name,
                          "' already updates in place; add every use of a parameter before the optimizer"));
    infer.inputs.push_back({info.shape, info.dtype});
    node.inputs.push_back(info.id);
  }
  // An update writes its first input in place: a parameter's view, never a batch or an activation.
  if (def.updates_in_place() &&
      (inputs.empty() || graph_.value(node.inputs[0]).role != ValueRole::Parameter))
    throw Error(cat(op, " '", node.name, "': updates its first input in place, which must be a parameter"));
  if (def.updates_in_place()) add_update_order(def, node);
  // Checked here as well as by Graph::add_node: nothing is added to the graph for a node refused.
  for (NodeId control : node.control_inputs)
    if (control < 0 || control >= static_cast<NodeId>(graph_.nodes().size()))
      throw Error(cat(op, " '", node.name, "': control input ", control, " does not exist"));
  const std::vector<TensorType> outputs = infer_outputs(def, node, std::move(infer.inputs));
  std::vector<Value> results;
  for (size_t i = 0; i < outputs.size(); ++i) {
    ValueInfo info;
    info.name = outputs.size() == 1 ? node.name : cat(node.name, ":", i);
    info.shape = outputs[i].shape;
    info.dtype = outputs[i].dtype;
    ValueId id = graph_.add_value(std::move(info));
    node.outputs.push_back(id);
    results.push_back(graph_.handle(id));
  }
  graph_.add_node(std::move(node));
  return results;
}

std::vector<TensorType> GraphBuilder::infer_outputs(const OpDef& def, const Node& node,
                                                    std::vector<TensorType> inputs) const {
  if (const std::string unknown = def.unknown_attribute(node.attrs); !unknown.empty())
    throw Error(cat(node.op, " '", node.name, "': ", unknown));
  const InferContext infer{node, std::move(inputs)};
  std::vector<TensorType> outputs;
  try {
    outputs = def.infer(infer);
  } catch (const Error& error) {
    // InferContext::fail names the op, the node and the shapes; other errors (a missing or
    // mistyped attribute) get them here.
    const std::string prefix = cat(node.op, " '", node.name, "': ");
    if (std::string_view(error.what()).starts_with(prefix)) throw;
    std::string shapes;
    for (size_t i = 0; i < infer.inputs.size(); ++i) shapes += cat(i ? ", " : "", infer.inputs[i].shape.str());
    throw Error(cat(prefix, error.what(), " (input shapes ", shapes, ")"));
  }
  for (size_t i = 0; i < outputs.size(); ++i)  // e.g. a reshape to (-2, -3), which keeps the element count
    check_extents(outputs[i].shape, cat(node.op, " '", node.name, "': output ", i));
  return outputs;
}

std::vector<TensorType> GraphBuilder::infer(const std::string& op, const std::vector<TensorType>& inputs, Attrs attrs,
                                            const std::string& name) const {
  const OpDef& def = OpRegistry::global().get(op);
  Node node;
  node.op = op;
  node.name = scoped(name.empty() ? op : name);
  node.attrs = std::move(attrs);
  return infer_outputs(def, node, inputs);
}

Value GraphBuilder::apply1(const std::string& op, const std::vector<Value>& inputs, Attrs attrs,
                           const std::string& name) {
  if (OpRegistry::global().get(op).updates_in_place())
    throw Error(cat(op, ": updates in place and has no output value; build it with apply()"));
  std::vector<Value> outputs = apply(op, inputs, std::move(attrs), name);
  if (outputs.empty()) throw Error(cat(op, ": has no output value; build it with apply()"));
  return outputs[0];
}

Attrs matmul_attrs(bool trans_a, bool trans_b) {
  Attrs attrs;
  attrs.set("trans_a", int64_t{trans_a}).set("trans_b", int64_t{trans_b});
  return attrs;
}

Attrs conv2d_attrs(Conv2dAttrs conv) {
  Attrs attrs;
  attrs.set("stride", conv.stride).set("padding", conv.padding);
  return attrs;
}

Value GraphBuilder::matmul(Value a, Value b, bool trans_a, bool trans_b, const std::string& name) {
  return apply1("matmul", {a, b}, matmul_attrs(trans_a, trans_b), name);
}

Value GraphBuilder::bias_add(Value x, Value bias, const std::string& name) {
  return apply1("bias_add", {x, bias}, {}, name);
}
Value GraphBuilder::add(Value a, Value b, const std::string& name) {
  return apply1("add", {a, b}, {}, name);
}
Value GraphBuilder::mul(Value a, Value b, const std::string& name) {
  return apply1("mul", {a, b}, {}, name);
}
Value GraphBuilder::relu(Value x, const std::string& name) { return apply1("relu", {x}, {}, name); }
Value GraphBuilder::sigmoid(Value x, const std::string& name) {
  return apply1("sigmoid", {x}, {}, name);
}
Value GraphBuilder::tanh(Value x, const std::string& name) { return apply1("tanh", {x}, {}, name); }

Value GraphBuilder::conv2d(Value x, Value w, Conv2dAttrs conv, const std::string& name) {
  return apply1("conv2d", {x, w}, conv2d_attrs(conv), name);
}

Value GraphBuilder::max_pool2d(Value x, int64_t kernel, int64_t stride, const std::string& name) {
  if (stride < 0) throw Error(cat("max_pool2d", name.empty() ? "" : cat(" '", scoped(name), "'"), ": stride must be >= 1 (or 0 for the kernel size), got ", stride));
  Attrs attrs;
  attrs.set("kernel", kernel).set("stride", stride > 0 ? stride : kernel);
  return apply("max_pool2d", {x}, attrs, name).at(0);
}

Value GraphBuilder::reshape(Value x, const Shape& shape, const std::string& name) {
  Attrs attrs;
  attrs.set("shape", shape.dims());
  return apply1("reshape", {x}, attrs, name);
}

Value GraphBuilder::flatten(Value x, const std::string& name) {
  const std::string what = name.empty() ? std::string("flatten") : cat("flatten '", name, "'");
  const Shape in = graph_.value(graph_.id_of(x, cat(what, ": input"))).shape;
  if (in.rank() < 1) throw Error(cat(what, ": input is a scalar"));
  return reshape(x, Shape{in[0], in.numel() / std::max<int64_t>(1, in[0])}, name);
}

Value GraphBuilder::softmax_cross_entropy(Value logits, Value labels, const std::string& name) {
  return apply("softmax_cross_entropy", {logits, labels}, {}, name).at(0);
}

Value GraphBuilder::lstm(Value x, Value wx, Value wh, Value b, const std::string& name) {
  return apply("lstm", {x, wx, wh, b}, {}, name).at(0);
}

Value GraphBuilder::select_step(Value x, int64_t step, const std::string& name) {
  Attrs attrs;
  attrs.set("step", step);
  return apply1("select_step", {x}, attrs, name);
}

Value GraphBuilder::fill(const Shape& shape, double value, const std::string& name) {
  Attrs attrs;
  attrs.set("shape", shape.dims()).set("value", value);
  return apply1("fill", {}, attrs, name);
}

}  // namespace quiver
