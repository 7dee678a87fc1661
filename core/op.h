// OpDef and the one op registry. An op kind is registered once (by its file in ops/): shape
// inference, the gradient (emitted as ordinary graph nodes), and an ordered list of kernels per
// device. Kernel choice walks that list: each implementation may decline a node and say why; the
// first that accepts wins, and the plain reference kernel is last.
// core defines the contract; ops/ and cuda/ fill it in; runtime/ decides who runs what where.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/graph.h"
#include "core/tensor.h"

namespace quiver {

class GraphBuilder;

// What a kernel may use: the threads the runtime granted it. Kernels parallelize only through
// parallel_for, which never runs more than threads() bodies at once.
class ExecContext {
 public:
  virtual ~ExecContext() = default;
  virtual int threads() const = 0;
  // Calls body(begin, end) over disjoint chunks of [0, count); chunks hold at most `grain` items.
  virtual void parallel_for(int64_t count, int64_t grain,
                            const std::function<void(int64_t, int64_t)>& body) const = 0;
  // Bytes of the scratch workspace the context's kernels share now (a device stream's; 0 where
  // there is none): what the largest request so far grew it to (KernelSpec::workspace_bytes).
  virtual int64_t workspace_size() const { return 0; }
  // Bytes the context itself holds on its device for as long as it lives, beside that scratch (a
  // device stream and its libraries' handles): a footprint counts them once per stream.
  virtual int64_t resident_bytes() const { return 0; }
};

// One thread, no pool: what tests and the serial policy use.
class SerialContext final : public ExecContext {
 public:
  int threads() const override { return 1; }
  void parallel_for(int64_t count, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& body) const override {
    if (count > 0) body(0, count);
  }
};

struct KernelCall {
  const ExecContext& ctx;
  const Node& node;
  std::span<const Tensor> inputs;
  std::span<const Tensor> outputs;  // preallocated; not zeroed
};

using KernelFn = std::function<void(const KernelCall&)>;

struct KernelSpec {
  const Graph& graph;
  const Node& node;
  const ValueInfo& input(int i) const { return graph.value(node.inputs.at(i)); }
  const ValueInfo& output(int i) const { return graph.value(node.outputs.at(i)); }
  // What prepare allocated for the kernel's own use (scratch, staged copies), in bytes: a kernel
  // adds it here so a Plan's footprint, and the memory checks built on it, count it.
  mutable int64_t scratch_bytes = 0;
  // The plan's context: on a device the stream every call comes with, so that prepare can make
  // choices that need it, such as a library's algorithm. On the CPU the plan's own thread budget,
  // which an executor replaces per call (a lane's budget): CPU kernels size their work by the
  // call's ExecContext, never by this one.
  const ExecContext* context = nullptr;
  // The most one call asks of the stream's shared scratch workspace, in bytes (device kernels:
  // StreamContext::workspace). The plans on a stream share that one buffer, so a stream needs
  // the largest request, not the sum.
  mutable int64_t workspace_bytes = 0;
};

struct KernelImpl {
  std::string name;  // "onednn_sgemm", "reference"
  DeviceKind device = DeviceKind::CPU;
  // Empty string: accepts the node. Otherwise why it declines.
  std::function<std::string(const KernelSpec&)> declines;
  // Called once per Plan per node: precompute geometry, create primitives, size scratch.
  std::function<KernelFn(const KernelSpec&)> prepare;
};

struct TensorType {
  Shape shape;
  DType dtype = DType::F32;
};

struct InferContext {
  const Node& node;
  std::vector<TensorType> inputs;
  const Shape& shape(int i) const { return inputs.at(i).shape; }
  // Throws quiver::Error naming the op, the node and all input shapes.
  [[noreturn]] void fail(const std::string& what) const;
};

// Given to an OpDef's backward: the forward node, the gradients flowing into its outputs (invalid
// where an output does not reach the loss), and where to put the gradients of its inputs.
class GradContext {
 public:
  GradContext(GraphBuilder& builder, const Node& node, std::vector<Value> output_grads,
              std::vector<bool> needs_grad);
  GraphBuilder& builder() { return builder_; }
  const Node& node() const { return node_; }
  Value input(int i) const;
  Value output(int i) const;
  Value output_grad(int i) const { return output_grads_.at(i); }
  Shape input_shape(int i) const;  // a copy: emitting nodes grows the graph
  // False for inputs no parameter's gradient flows through (the images): skip their work.
  bool needs_grad(int i) const { return needs_grad_.at(i); }
  // A rule must set the gradient of every input whose needs_grad() is true (a zero fill where it
  // is zero): build_backward() refuses a rule that leaves one out, which would train the
  // parameters behind it on part of their gradient.
  void set_input_grad(int i, Value grad);
  const std::vector<Value>& input_grads() const { return input_grads_; }
  std::string name(const std::string& suffix) const;  // "<node>/grad/<suffix>"
  // For outputs an op does not differentiate (softmax_cross_entropy's probabilities, the LSTM's
  // cache): throws quiver::Error naming the op, the node and the output if a gradient reaches it,
  // rather than dropping that gradient.
  void no_gradient_through(int output, const std::string& what) const;

 private:
  GraphBuilder& builder_;
  Node node_;  // a copy: emitting nodes may grow the graph's node vector
  std::vector<Value> output_grads_;
  std::vector<Value> input_grads_;
  std::vector<bool> needs_grad_;
};

struct OpDef {
  std::string kind;
  std::function<std::vector<TensorType>(const InferContext&)> infer;
  std::function<void(GradContext&)> backward;  // empty: not differentiable
  // Optimizer updates: the inputs written in place, the parameter (input 0) first, then its
  // optimizer state. Empty for every other op.
  std::vector<int> written_inputs;
  std::vector<KernelImpl> kernels;
  // Every attribute the op's inference, gradient and kernels read. A node carrying any other is
  // refused when it is built (GraphBuilder) and when a Plan checks it: a misspelt or unsupported
  // attribute (conv2d's "dilation") is an error, not silently ignored. Empty: the op takes none.
  std::vector<std::string> attributes;

  bool updates_in_place() const { return !written_inputs.empty(); }
  // Empty if `attrs` holds only attributes this op takes; otherwise which one it does not, and
  // what it takes.
  std::string unknown_attribute(const Attrs& attrs) const;
};

class OpRegistry {
 public:
  static OpRegistry& global();
  void add(OpDef def);                                    // a kind registers once
  // A kernel for a kind not registered yet waits until it is: op files and backend files (cuda/)
  // register from static initialisers whose order across files is unspecified.
  void add_kernel(const std::string& kind, KernelImpl impl, bool prefer = false);
  const OpDef& get(const std::string& kind) const;       // throws for an unknown kind
  bool has(const std::string& kind) const;
  std::vector<std::string> kinds() const;
  // Kinds that have kernels waiting but were never registered (a misspelt kind in a backend).
  std::vector<std::string> orphan_kernel_kinds() const;

 private:
  struct Pending {
    std::string kind;
    KernelImpl impl;
    bool prefer;
  };
  std::vector<OpDef> defs_;
  std::vector<Pending> pending_;
};

// Each op file registers itself at load time: `static const bool registered = register_op(...)`.
bool register_op(OpDef def);

}  // namespace quiver
