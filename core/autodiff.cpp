#include "core/autodiff.h"

#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"
#include "core/float_range.h"
#include "core/log.h"
#include "core/op.h"

namespace quiver {

namespace {

// Sums the contributions to one value's gradient with a chain of add nodes. `name` is a copy:
// callers pass a value's name, and each add grows the graph's value vector under it.
Value sum_contributions(GraphBuilder& builder, const std::vector<Value>& parts, const std::string name) {
  Value total = parts.at(0);
  for (size_t i = 1; i < parts.size(); ++i)
    total = builder.add(total, parts[i], cat(name, "/accumulate_", i));
  return total;
}

}  // namespace

void build_backward(GraphBuilder& builder, Value loss) {
  Graph& graph = builder.graph();
  const ValueInfo& loss_info = graph.value(graph.id_of(loss, "backward: loss"));
  if (loss_info.shape.rank() != 0)
    throw Error(cat("backward: loss '", loss_info.name, "' must be a scalar, not ", loss_info.shape.str()));
  if (loss_info.dtype != DType::F32)
    throw Error(cat("backward: loss '", loss_info.name, "' must be a float32 scalar, not ", name_of(loss_info.dtype)));
  const std::string loss_name = loss_info.name;  // a copy: the graph's values grow below
  for (const ParamInfo& param : graph.params())
    if (param.grad >= 0) throw Error("backward: gradients were already built for this graph");

  std::vector<bool> requires_grad(graph.values().size(), false);
  for (const ParamInfo& param : graph.params()) requires_grad[graph.value(param.value).id] = true;  // value(): exists
  const int forward_nodes = static_cast<int>(graph.nodes().size());
  for (NodeId id = 0; id < forward_nodes; ++id) {
    const Node& node = graph.node(id);
    bool any = false;
    for (ValueId input : node.inputs) any = any || requires_grad[input];
    for (ValueId output : node.outputs)
      requires_grad[output] = any && graph.value(output).dtype == DType::F32;
  }

  // Which parameters the loss reaches, before anything is emitted: nothing to train is a mistake
  // in the model (a loss built from the wrong value) and leaves the graph as it was; a parameter
  // the loss does not reach gets a zero gradient and is said once (a frozen or unused layer).
  std::vector<bool> reaches_loss(graph.values().size(), false);
  reaches_loss[loss.id] = true;
  for (NodeId id = forward_nodes - 1; id >= 0; --id) {
    const Node& node = graph.node(id);
    bool any = false;
    for (ValueId output : node.outputs) any = any || reaches_loss[output];
    if (any)
      for (ValueId input : node.inputs) reaches_loss[input] = reaches_loss[input] || requires_grad[input];
  }
  std::vector<std::string> unreached;
  for (const ParamInfo& param : graph.params())
    if (!reaches_loss[param.value]) unreached.push_back(param.name);
  if (unreached.size() == graph.params().size())
    throw Error(graph.params().empty()
                    ? cat("backward: the graph has no parameters: nothing to train")
                    : cat("backward: loss '", loss_name, "' depends on none of the ", graph.params().size(),
                          " parameters (", unreached.front(), unreached.size() > 1 ? ", ..." : "",
                          "): nothing would train"));
  for (const std::string& name : unreached)
    warn_once(cat("backward: parameter '", name, "' does not reach loss '", loss_name, "': its gradient is zero"));

  std::map<ValueId, std::vector<Value>> contributions;
  contributions[loss.id].push_back(builder.fill(Shape{}, 1.0, "loss/grad_seed"));

  for (NodeId id = forward_nodes - 1; id >= 0; --id) {
    const Node node = graph.node(id);  // copy: emitting nodes grows the node vector
    std::vector<Value> output_grads;
    bool has_grad = false;
    for (ValueId output : node.outputs) {
      auto found = contributions.find(output);
      if (found == contributions.end()) {
        output_grads.push_back(Value{});
        continue;
      }
      output_grads.push_back(sum_contributions(builder, found->second, graph.value(output).name));
      has_grad = true;
    }
    bool wants_grad = false;
    for (ValueId input : node.inputs) wants_grad = wants_grad || requires_grad[input];
    if (!has_grad || !wants_grad) continue;
    const OpDef& def = OpRegistry::global().get(node.op);
    if (!def.backward)
      throw Error(cat(node.op, " '", node.name, "': op has no gradient but a parameter depends on it"));
    std::vector<bool> needs_grad;
    for (ValueId input : node.inputs) needs_grad.push_back(requires_grad[input]);
    GradContext context(builder, node, output_grads, needs_grad);
    def.backward(context);
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (!requires_grad[node.inputs[i]]) continue;
      const Value grad = context.input_grads()[i];
      // A rule that leaves out an input a parameter reaches the loss through would train that
      // parameter on part of its gradient (or none), without a word.
      if (!grad.valid())
        throw Error(cat(node.op, " '", node.name, "': its gradient rule gave no gradient for input ", i, " ('",
                        graph.value(node.inputs[i]).name, "'), which a parameter reaches the loss through"));
      contributions[node.inputs[i]].push_back(grad);
    }
  }

  for (size_t index = 0; index < graph.params().size(); ++index) {
    ParamInfo& param = graph.params()[index];
    const Shape shape = graph.value(param.value).shape;
    auto found = contributions.find(param.value);
    Value grad = found == contributions.end()
                     ? builder.fill(shape, 0.0, param.name + "/grad_zero")
                     : sum_contributions(builder, found->second, param.name + "/grad");
    // A gradient that is not a plain activation (or already some other parameter's gradient)
    // gets its own copy, so that every ParamGrad owns its slice of the flat gradient buffer.
    if (graph.value(grad.id).role != ValueRole::Activation)
      grad = builder.apply1("copy", {grad}, {}, param.name + "/grad_copy");
    ValueInfo& info = graph.value(grad.id);
    info.role = ValueRole::ParamGrad;
    info.param_index = static_cast<int>(index);
    info.name = param.name + "/grad";
    graph.params()[index].grad = grad.id;
  }
}

namespace {

// The learning rate and Adam's step are fed each step: inputs, not parameters the update would
// also be training (or activations computed from them).
void check_fed(const Graph& graph, Value value, const char* what) {
  const ValueInfo& info = graph.value(graph.id_of(value, cat("optimizer: ", what)));
  if (info.role != ValueRole::Input || info.shape.numel() != 1)  // its dtype: the update op's check
    throw Error(cat("optimizer: the ", what, " '", info.name, "' must be an input of one value, fed each step"));
}

// Updates need gradients, and one optimizer: a second would update every parameter twice a step
// (two SGD updates would also share one velocity).
void check_ready_for_updates(const Graph& graph) {
  for (const ParamInfo& param : graph.params())
    if (param.grad < 0) throw Error("optimizer: call build_backward before adding updates");
  for (const Node& node : graph.nodes())
    if (OpRegistry::global().get(node.op).updates_in_place())
      throw Error(cat("optimizer: the graph has updates already ('", node.name, "'); add one optimizer, once"));
}

}  // namespace

void add_sgd_update(GraphBuilder& builder, Value learning_rate, const SgdOptions& options) {
  Graph& graph = builder.graph();
  check_ready_for_updates(graph);
  check_fed(graph, learning_rate, "learning rate");
  if (const std::string problem = float_fraction_problem(options.momentum, false); !problem.empty())
    throw Error(cat("sgd: momentum ", problem));
  if (!(options.weight_decay >= 0.0 && std::isfinite(options.weight_decay)))
    throw Error(cat("sgd: weight decay must be finite and >= 0, got ", options.weight_decay));
  for (size_t index = 0; index < graph.params().size(); ++index) {
    ParamInfo param = graph.params()[index];
    Value velocity = builder.state(static_cast<int>(index), "velocity");
    Attrs attrs;
    attrs.set("momentum", options.momentum).set("weight_decay", options.weight_decay);
    builder.apply("sgd_update", {graph.handle(param.value), graph.handle(param.grad), velocity, learning_rate},
                  attrs, param.name + "/update");
  }
}

void add_adam_update(GraphBuilder& builder, Value learning_rate, Value step,
                     const AdamOptions& options) {
  Graph& graph = builder.graph();
  check_ready_for_updates(graph);
  check_fed(graph, learning_rate, "learning rate");
  check_fed(graph, step, "step");
  // beta = 1 would divide by zero in the bias correction; epsilon = 0 would turn a zero gradient into 0/0.
  if (const std::string problem = float_fraction_problem(options.beta1, false); !problem.empty())
    throw Error(cat("adam: beta1 ", problem));
  if (const std::string problem = float_fraction_problem(options.beta2, false); !problem.empty())
    throw Error(cat("adam: beta2 ", problem));
  if (!(options.epsilon >= std::numeric_limits<float>::min() && options.epsilon <= std::numeric_limits<float>::max()))
    throw Error(cat("adam: epsilon must be in a 32-bit float's normal range [", std::numeric_limits<float>::min(), ", ",
                    std::numeric_limits<float>::max(), "], got ", options.epsilon));
  if (!(options.weight_decay >= 0.0 && std::isfinite(options.weight_decay)))
    throw Error(cat("adam: weight decay must be finite and >= 0, got ", options.weight_decay));
  for (size_t index = 0; index < graph.params().size(); ++index) {
    ParamInfo param = graph.params()[index];
    Value first_moment = builder.state(static_cast<int>(index), "adam_m");
    Value second_moment = builder.state(static_cast<int>(index), "adam_v");
    Attrs attrs;
    attrs.set("beta1", options.beta1).set("beta2", options.beta2)
        .set("epsilon", options.epsilon).set("weight_decay", options.weight_decay);
    builder.apply("adam_update",
                  {graph.handle(param.value), graph.handle(param.grad), first_moment, second_moment,
                   learning_rate, step},
                  attrs, param.name + "/update");
  }
}

}  // namespace quiver
