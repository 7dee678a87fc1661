#include "runtime/plan.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "core/denormals.h"
#include "core/device.h"
#include "core/error.h"
#include "runtime/thread_budget.h"

namespace quiver {

namespace {

// Nodes the fetches and every in-place update depend on, in id (topological) order.
std::vector<NodeId> needed_nodes(const Graph& graph, const std::vector<Value>& fetches) {
  std::vector<bool> needed(graph.nodes().size(), false);
  std::vector<NodeId> stack;
  for (size_t i = 0; i < fetches.size(); ++i) {
    NodeId producer = graph.value(graph.id_of(fetches[i], cat("plan: fetch ", i))).producer;
    if (producer >= 0) stack.push_back(producer);
  }
  for (const Node& node : graph.nodes())
    if (OpRegistry::global().get(node.op).updates_in_place()) stack.push_back(node.id);
  while (!stack.empty()) {
    NodeId id = stack.back();
    stack.pop_back();
    // First: node() refuses an id that names no node (a producer edited through Graph::value()),
    // which would index past `needed`.
    const Node& node = graph.node(id);
    if (needed[id]) continue;
    needed[id] = true;
    for (ValueId input : node.inputs)
      if (graph.value(input).producer >= 0) stack.push_back(graph.value(input).producer);
    for (NodeId control : node.control_inputs) stack.push_back(control);
  }
  std::vector<NodeId> order;
  for (NodeId id = 0; id < static_cast<NodeId>(needed.size()); ++id)
    if (needed[id]) order.push_back(id);
  return order;
}

// A graph built through Graph's own API (add_value, add_node, a mutable value()) was never checked
// by the builder: a node must read only values that exist when it runs, and its outputs must be
// what its op infers from its inputs, or its kernel would read nothing or write past a buffer.
void check_node(const Graph& graph, const Node& node) {
  const std::string where = cat("plan: ", node.op, " '", node.name, "': ");
  InferContext infer{node, {}};
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ValueInfo& input = graph.value(node.inputs[i]);
    if (input.role == ValueRole::Activation && input.producer < 0)
      throw Error(cat(where, "input ", i, " '", input.name, "' is an activation that no node computes"));
    // A producer set through the mutable value() must be an earlier node that lists the value.
    if (input.role == ValueRole::Activation) {
      const bool made_earlier = input.producer < node.id &&
                                std::ranges::count(graph.node(input.producer).outputs, input.id) > 0;
      if (!made_earlier)
        throw Error(cat(where, "input ", i, " '", input.name, "' claims node ", input.producer,
                        " computes it; no earlier node does"));
    }
    infer.inputs.push_back({input.shape, input.dtype});
  }
  const OpDef& def = OpRegistry::global().get(node.op);
  if (const std::string unknown = def.unknown_attribute(node.attrs); !unknown.empty()) throw Error(cat(where, unknown));
  std::vector<TensorType> inferred;
  try {
    inferred = def.infer(infer);
  } catch (const std::exception& error) {  // InferContext::fail names the op and the node already
    const std::string said = error.what(), named = cat(node.op, " '", node.name, "': ");
    throw Error(cat(where, "its inputs no longer fit its op: ", said.starts_with(named) ? said.substr(named.size()) : said));
  }
  if (inferred.size() != node.outputs.size())
    throw Error(cat(where, "its op makes ", inferred.size(), " outputs; the node has ", node.outputs.size()));
  for (size_t i = 0; i < inferred.size(); ++i) {
    const ValueInfo& output = graph.value(node.outputs[i]);
    if (output.shape != inferred[i].shape || output.dtype != inferred[i].dtype)
      throw Error(cat(where, "output ", i, " '", output.name, "' is ", output.shape.str(), " ", name_of(output.dtype),
                      "; its op makes ", inferred[i].shape.str(), " ", name_of(inferred[i].dtype), " of its inputs"));
  }
}

}  // namespace

[[noreturn]] void rethrow_naming(const Node& node) {
  try {
    throw;
  } catch (const Error& error) {
    if (std::string(error.what()).find("'" + node.name + "'") != std::string::npos) throw;
    throw Error(cat(node.op, " '", node.name, "': ", error.what()));
  } catch (const std::exception& error) {
    throw Error(cat(node.op, " '", node.name, "': ", error.what()));
  } catch (...) {  // not a std::exception: nothing to say but where
    throw Error(cat(node.op, " '", node.name, "': the kernel threw an exception of an unknown type"));
  }
}

Plan::Plan(const Graph& graph, ParamStore& store, const std::vector<Value>& fetches,
           PlanOptions options)
    : graph_(graph), tensors_(graph.values().size()) {
  if (options.threads < 1) throw Error(cat("plan: threads must be >= 1, got ", options.threads));
  device_ = options.device;
  if (store.device() != device_)
    throw Error(cat("plan: the parameters are on ", store.device().str(), " but the plan is for ", device_.str()));
  if (!device_.is_cpu())
    context_ = options.stream ? options.stream : std::shared_ptr<ExecContext>(backend_for(device_).make_stream(device_.index));
  else if (options.threads == 1)
    context_ = std::make_shared<SerialContext>();
  else
    context_ = std::make_shared<ThreadBudget>(options.threads);
  profile_ = options.profile;
  device_graphs_ = options.device_graphs && !device_.is_cpu();
  store.check_compatible(graph_);
  for (NodeId id : needed_nodes(graph_, fetches)) {
    check_node(graph_, graph_.node(id));
    PlanStep step;
    step.node = id;
    steps_.push_back(std::move(step));
  }
  bind_values(store);
  plan_activations(fetches);
  order_in_place_updates();
  choose_kernels(options);
  // What tensor() hands out: values whose tensors hold them after run(). An activation that is
  // not fetched shares its buffer with later ones; a gradient that no step computes holds
  // whatever the store's buffer held.
  std::vector<bool> in_plan(graph_.nodes().size(), false);
  for (const PlanStep& step : steps_) in_plan[static_cast<size_t>(step.node)] = true;
  readable_.assign(graph_.values().size(), false);
  for (const ValueInfo& info : graph_.values())
    readable_[static_cast<size_t>(info.id)] =
        info.role != ValueRole::Activation &&
        (info.role != ValueRole::ParamGrad || info.producer < 0 || in_plan[static_cast<size_t>(info.producer)]);
  for (Value fetch : fetches) readable_[static_cast<size_t>(fetch.id)] = true;
}

Plan::~Plan() {
  if (!device_graph_) return;
  try {  // a replay may still be running: let it finish before its graph goes
    synchronize();
  } catch (const Error&) {  // the stream's error surfaced elsewhere already; destroy anyway
  }
  device_graph_.reset();
}

void Plan::bind_values(ParamStore& store) {
  // A value bound to a slot of the store must be what the slot holds: one made or changed through
  // Graph's own API may declare another shape, and a kernel prepared from it would read or write
  // past the slot's slice of the flat buffer.
  auto checked = [&](const ValueInfo& info, const char* role) -> int {
    const int slots = static_cast<int>(store.slots().size());
    if (info.param_index < 0 || info.param_index >= slots)
      throw Error(cat("plan: ", role, " '", info.name, "' names parameter slot ", info.param_index, "; the store has ",
                      slots));
    const ParamSlot& slot = store.slots()[info.param_index];
    if (info.shape != slot.shape || info.dtype != DType::F32)
      throw Error(cat("plan: ", role, " '", info.name, "' is ", info.shape.str(), " ", name_of(info.dtype), "; its slot '",
                      slot.name, "' holds ", slot.shape.str(), " f32"));
    return info.param_index;
  };
  for (const ValueInfo& info : graph_.values()) {
    switch (info.role) {
      case ValueRole::Input:
        tensors_[info.id] = Tensor::zeros(info.shape, info.dtype, device_);
        input_bytes_ += tensors_[info.id].bytes();
        break;
      case ValueRole::Parameter:
        tensors_[info.id] = store.param(checked(info, "parameter"));
        break;
      case ValueRole::ParamGrad:
        tensors_[info.id] = store.grad(checked(info, "gradient"));
        break;
      case ValueRole::State:
        tensors_[info.id] = store.state(info.state_kind, checked(info, "optimizer state"));
        break;
      case ValueRole::Activation:
        break;
    }
  }
}

void Plan::plan_activations(const std::vector<Value>& fetches) {
  constexpr int kForever = std::numeric_limits<int>::max();
  std::map<ValueId, int> last_use;
  for (int position = 0; position < static_cast<int>(steps_.size()); ++position) {
    const Node& node = graph_.node(steps_[position].node);
    for (ValueId output : node.outputs) last_use[output] = position;
    for (ValueId input : node.inputs) last_use[input] = position;
  }
  for (Value fetch : fetches) last_use[fetch.id] = kForever;

  struct Buffer {
    std::shared_ptr<Storage> storage;
    bool free = false;
    std::vector<int> users;  // steps that wrote or read the current occupant
  };
  std::vector<Buffer> buffers;
  std::map<ValueId, size_t> buffer_of;
  auto acquire = [&](int64_t bytes) {
    size_t best = buffers.size();
    for (size_t i = 0; i < buffers.size(); ++i)
      if (buffers[i].free && buffers[i].storage->bytes() >= bytes &&
          (best == buffers.size() || buffers[i].storage->bytes() < buffers[best].storage->bytes()))
        best = i;
    if (best == buffers.size()) {
      buffers.push_back({std::make_shared<Storage>(std::max<int64_t>(bytes, 4), device_), false, {}});
      activation_bytes_ += std::max<int64_t>(bytes, 4);
    }
    buffers[best].free = false;
    return best;
  };

  for (int position = 0; position < static_cast<int>(steps_.size()); ++position) {
    const Node& node = graph_.node(steps_[position].node);
    for (ValueId output : node.outputs) {
      const ValueInfo& info = graph_.value(output);
      if (info.role != ValueRole::Activation) continue;
      size_t buffer = acquire(info.shape.numel() * size_of(info.dtype));
      buffer_of[output] = buffer;
      // Reusing a buffer orders this step after every user of its previous occupant: serially
      // that is already so; a concurrent executor needs the edge (write after read).
      for (int user : buffers[buffer].users)
        if (user != position) steps_[position].after.push_back(user);
      buffers[buffer].users = {position};
      tensors_[output] = Tensor(buffers[buffer].storage, 0, info.shape, info.dtype);
    }
    for (ValueId input : node.inputs) {
      auto found = buffer_of.find(input);
      if (found != buffer_of.end()) buffers[found->second].users.push_back(position);
    }
    // Released only after this node's outputs are placed: an op never writes over its own input.
    std::vector<ValueId> touched = node.inputs;
    touched.insert(touched.end(), node.outputs.begin(), node.outputs.end());
    for (ValueId value : touched) {
      auto found = buffer_of.find(value);
      if (found != buffer_of.end() && last_use[value] == position) buffers[found->second].free = true;
    }
  }
}

void Plan::order_in_place_updates() {
  // A parameter or its optimizer state written in place has no value for a data edge to follow.
  // GraphBuilder gives the update a control input per reader (add_update_order); a graph made
  // with Graph::add_node may lack them, and a concurrent executor would then run the update
  // beside a reader (a weight's gradient GEMM reading a half-updated weight).
  std::map<ValueId, std::vector<int>> readers;
  for (int position = 0; position < static_cast<int>(steps_.size()); ++position)
    for (ValueId input : graph_.node(steps_[position].node).inputs) readers[input].push_back(position);
  for (int update = 0; update < static_cast<int>(steps_.size()); ++update) {
    const Node& node = graph_.node(steps_[update].node);
    for (int written : OpRegistry::global().get(node.op).written_inputs) {
      if (written >= static_cast<int>(node.inputs.size())) continue;  // too few inputs: check_node named it
      for (int reader : readers[node.inputs[static_cast<size_t>(written)]]) {
        if (reader < update) steps_[update].after.push_back(reader);
        if (reader > update) steps_[reader].after.push_back(update);
      }
    }
  }
}

void Plan::choose_kernels(const PlanOptions& options) {
  if (!options.prefer_kernel.empty()) {  // a misspelt name would otherwise be ignored in silence
    std::set<std::string> names;
    const OpRegistry& registry = OpRegistry::global();
    for (const std::string& kind : registry.kinds())
      for (const KernelImpl& impl : registry.get(kind).kernels)
        if (impl.device == device_.kind) names.insert(impl.name);
    if (!names.count(options.prefer_kernel)) {
      std::string known;
      for (const std::string& name : names) known += cat(known.empty() ? "" : ", ", name);
      throw Error(cat("plan: prefer_kernel '", options.prefer_kernel, "' names no ", device_.is_cpu() ? "CPU" : "CUDA",
                      " kernel (those are: ", known, ")"));
    }
  }
  for (PlanStep& step : steps_) {
    const Node& node = graph_.node(step.node);
    const OpDef& def = OpRegistry::global().get(node.op);
    KernelSpec spec{graph_, node};
    spec.context = context_.get();
    const KernelImpl* chosen = nullptr;
    std::string reasons;
    for (const KernelImpl& impl : def.kernels) {
      if (impl.device != device_.kind) continue;
      std::string why = impl.declines ? impl.declines(spec) : "";
      if (!why.empty()) {
        reasons += cat(" ", impl.name, ": ", why, ";");
        continue;
      }
      if (!chosen || impl.name == options.prefer_kernel) chosen = &impl;
      if (options.prefer_kernel.empty()) break;
    }
    if (!chosen)
      throw Error(cat(node.op, " '", node.name, "': no ", device_.is_cpu() ? "CPU" : "CUDA",
                      " kernel accepts this node;", reasons));
    step.kernel_name = chosen->name;
    try {  // a missing attribute, a library's refusal: named like a kernel's error at run time
      step.kernel = chosen->prepare(spec);
    } catch (...) {
      rethrow_naming(node);
    }
    kernel_bytes_ += spec.scratch_bytes;
    workspace_bytes_ = std::max(workspace_bytes_, spec.workspace_bytes);
    for (ValueId input : node.inputs) step.inputs.push_back(tensors_[input]);
    for (ValueId output : node.outputs) step.outputs.push_back(tensors_[output]);
  }
}

bool Plan::has_input(const std::string& name) const {
  for (const ValueInfo& info : graph_.values())
    if (info.role == ValueRole::Input && info.name == name) return true;
  return false;
}

const Tensor& Plan::input(const std::string& name) const {
  ValueId id = graph_.find(name);
  if (graph_.value(id).role != ValueRole::Input) throw Error(cat("'", name, "' is not an input"));
  return tensors_[id];
}

const Tensor& Plan::tensor(Value value) const {
  const ValueId id = graph_.id_of(value, "plan: tensor");
  const Tensor& tensor = tensors_[static_cast<size_t>(id)];
  const ValueInfo& info = graph_.value(id);
  if (!tensor.defined() || (info.role == ValueRole::ParamGrad && !readable_[static_cast<size_t>(id)]))
    throw Error(cat("value '", info.name, "' is not computed by this plan (fetch it when the plan is made)"));
  if (!readable_[static_cast<size_t>(id)])
    throw Error(cat("value '", info.name, "' is not kept by this plan: its buffer is reused within a run ",
                    "(fetch it when the plan is made to read it)"));
  return tensor;
}

void Plan::run() {
  int64_t run_index = begin_run();
  if (device_graphs_ && !profile_ && !trace_ && run_device_graph()) return;
  for (int position = 0; position < static_cast<int>(steps_.size()); ++position)
    run_step(position, *context_, run_index);
}

// Eager runs first: kernels pick their algorithms and the stream's workspace reaches its size
// (a graph records pointers, so nothing may move after the capture). Then one run is captured
// and every later run replays it, until the workspace moves (another plan on the stream needed
// more), which means eager runs and a new capture. False: run eagerly this time.
bool Plan::run_device_graph() {
  constexpr int kEagerRunsBeforeCapture = 2;
  DeviceBackend& backend = backend_for(device_);
  if (device_graph_ && backend.replay(*context_, device_graph_.get())) return true;
  if (device_graph_) device_graph_.reset(), eager_runs_ = 0;
  if (eager_runs_++ < kEagerRunsBeforeCapture) return false;
  try {
    device_graph_ = backend.capture(
        *context_,
        [this] {
          for (int position = 0; position < static_cast<int>(steps_.size()); ++position)
            run_step(position, *context_, runs_);
        },
        device_graph_failure_);
  } catch (const Error& error) {  // a kernel's library refused to be captured: stay eager
    device_graph_failure_ = error.what();
  }
  if (!device_graph_) {
    device_graphs_ = false;
    return false;
  }
  return backend.replay(*context_, device_graph_.get());
}

void Plan::upload(const Tensor& dst, const void* src) const {
  if (src == nullptr && dst.bytes() > 0)  // a batch pointer never set: a message, not a segfault
    throw Error(cat("plan upload: no data (a null pointer) for a tensor of ", dst.shape().str()));
  if (device_.is_cpu())
    std::memcpy(dst.raw(), src, static_cast<size_t>(dst.bytes()));
  else
    backend_for(device_).upload(*context_, dst.raw(), src, dst.bytes());
}

void Plan::download(void* dst, const Tensor& src) const {
  if (dst == nullptr && src.bytes() > 0)
    throw Error(cat("plan download: nowhere to put a tensor of ", src.shape().str(), " (a null pointer)"));
  if (device_.is_cpu())
    std::memcpy(dst, src.raw(), static_cast<size_t>(src.bytes()));
  else
    backend_for(device_).download(*context_, dst, src.raw(), src.bytes());
}

void Plan::copy(const Tensor& dst, const Tensor& src) const {
  if (dst.bytes() != src.bytes() || dst.device() != device_ || src.device() != device_)
    throw Error(cat("plan copy: ", src.shape().str(), " on ", src.device().str(), " into ", dst.shape().str(), " on ",
                    dst.device().str(), " (plan on ", device_.str(), ")"));
  if (device_.is_cpu())
    std::memcpy(dst.raw(), src.raw(), static_cast<size_t>(dst.bytes()));
  else
    backend_for(device_).copy_async(*context_, dst.raw(), src.raw(), dst.bytes());
}

void Plan::synchronize() const {
  if (!device_.is_cpu()) backend_for(device_).synchronize(*context_);
}

void Plan::run_step(int position, const ExecContext& ctx, int64_t run_index) {
  if (position < 0 || position >= static_cast<int>(steps_.size()))
    throw Error(cat("plan: no step ", position, " (the plan has ", steps_.size(), ")"));
  PlanStep& step = steps_[static_cast<size_t>(position)];
  const Node& node = graph_.node(step.node);
  try {
    auto start = profile_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    int64_t trace_start = trace_ ? trace_->now_us() : 0;
    {
      const FlushDenormals flushed;  // core/denormals.h: no subnormal assists inside kernels
      step.kernel(KernelCall{ctx, node, step.inputs, step.outputs});
    }
    if (profile_) {
      // A device kernel returns once it is queued: the profile waits for it to finish on the
      // stream (the previous step's wait leaves nothing else queued before it), so each step's
      // time is its own GPU time, not its launch's. A trace keeps the stream's overlap instead: its
      // device events span the launches.
      if (!device_.is_cpu()) backend_for(device_).synchronize(ctx);
      step.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (trace_)
      trace_->record(TraceEvent{node.name, node.op, step.kernel_name, trace_start, trace_->now_us() - trace_start,
                                trace_thread_index(), ctx.threads(), run_index + trace_step_offset_, trace_learner_});
  } catch (...) {
    rethrow_naming(node);
  }
}

}  // namespace quiver

namespace quiver {

std::string Plan::profile_report(int top) const {
  std::vector<const PlanStep*> order;
  double total = 0.0;
  for (const PlanStep& step : steps_) {
    order.push_back(&step);
    total += step.seconds;
  }
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->seconds > b->seconds; });
  std::string report;
  for (int i = 0; i < top && i < static_cast<int>(order.size()); ++i) {
    const Node& node = graph_.node(order[i]->node);
    char line[256];
    std::snprintf(line, sizeof(line), "  %-26s %-40s %-13s %8.3f s  %5.1f%%\n", node.op.c_str(),
                  node.name.c_str(), order[i]->kernel_name.c_str(), order[i]->seconds,
                  total > 0 ? 100.0 * order[i]->seconds / total : 0.0);
    report += line;
  }
  return report;
}

}  // namespace quiver
