// Plan: a graph compiled for execution on one device. Compiling picks the nodes the fetched values
// and the parameter updates need (in id order, which is a topological order), binds parameters,
// gradients and optimizer state to the replica's flat buffers, plans activation memory (buffers
// are reused once their last reader has run), chooses each node's kernel from the registry and
// prepares it once. run() executes the steps serially: the reference executor. The plan keeps a
// copy of the graph, so the builder and its graph may go (or grow) once the plan is made.
// A plan on a CUDA device keeps every tensor on that device and queues its kernels, in order, on
// its stream (its own, or one shared with other plans of the same learner); the host reaches its
// tensors through upload() and download(), which go through that stream.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/graph.h"
#include "core/op.h"
#include "runtime/param_store.h"
#include "runtime/trace.h"

namespace quiver {

struct PlanOptions {
  int threads = 1;
  // Use the kernel of this name wherever an op has one ("reference" in tests); else registry order.
  std::string prefer_kernel;
  // Accumulate each step's wall time (PlanStep::seconds); for profiles, off by default. On a
  // device each step then waits for its kernels to finish on the stream.
  bool profile = false;
  // Where tensors live and kernels run; the store's buffers must be on the same device.
  Device device;
  // A device plan's stream (DeviceBackend::make_stream); null: the plan makes its own.
  std::shared_ptr<ExecContext> stream;
  // On a device: after a few eager runs, capture one run as a graph (CUDA graphs) and replay it,
  // one launch per run instead of one per kernel. Not while profiling or tracing.
  bool device_graphs = true;
};

struct PlanStep {
  NodeId node = -1;
  std::string kernel_name;
  KernelFn kernel;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  double seconds = 0.0;  // accumulated over runs when PlanOptions::profile is set
  // Positions of earlier steps that must finish first beyond data and control edges: the users of
  // the previous occupant of a reused activation buffer, and around a value updated in place, its
  // readers before the update (for the update) and the update (for its readers after it).
  std::vector<int> after;
};

// Rethrows the exception being handled as a quiver::Error that names `node` (one that names it
// already passes as it is): for errors while its kernel is prepared and runs, and while an
// executor readies its threads.
[[noreturn]] void rethrow_naming(const Node& node);

class Plan {
 public:
  Plan(const Graph& graph, ParamStore& store, const std::vector<Value>& fetches,
       PlanOptions options = {});
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // The tensor to fill before run() for the input named `name`.
  const Tensor& input(const std::string& name) const;
  bool has_input(const std::string& name) const;
  // A value's tensor, to read after run() (or fill before it): an input, a parameter, optimizer
  // state, a fetched value, or a gradient the plan computes. Another value is refused: an
  // activation not fetched shares its buffer with later ones, a gradient no step computes (no
  // optimizer reads it and it is not fetched) holds nothing of this plan's.
  const Tensor& tensor(Value value) const;
  void run();
  Device device() const { return device_; }
  // The context run() passes to every kernel: a thread budget on the CPU, a stream on a device.
  const ExecContext& context() const { return *context_; }
  const std::shared_ptr<ExecContext>& shared_context() const { return context_; }
  // Host <-> tensor copies in stream order: a plain memcpy on the CPU; on a device, upload
  // returns once `src` may be reused and download waits for the work queued before it.
  void upload(const Tensor& dst, const void* src) const;
  void download(void* dst, const Tensor& src) const;
  // dst = src for two tensors on the plan's device, in stream order.
  void copy(const Tensor& dst, const Tensor& src) const;
  // Blocks until the plan's queued device work is done (nothing to wait for on the CPU).
  void synchronize() const;
  // The pieces run() is made of, for other executors: number a new run, then execute one step
  // (by position) with the given context; errors are rethrown naming the node.
  int64_t begin_run() { return ++runs_; }
  void run_step(int position, const ExecContext& ctx, int64_t run_index);
  // Record every op execution of later runs into `trace` (nullptr stops); not owned. Events are
  // learner `learner`'s when >= 0, and the next run is step `next_step` (default: the run count,
  // from 1), so a learner's ops carry its group's round.
  void set_trace(Trace* trace, int learner = -1, int64_t next_step = 0) {
    trace_ = trace, trace_learner_ = learner;
    trace_step_offset_ = next_step > 0 ? next_step - (runs_ + 1) : 0;
  }

  const Graph& graph() const { return graph_; }
  const std::vector<PlanStep>& steps() const { return steps_; }
  std::vector<PlanStep>& steps() { return steps_; }
  // "op 'node' [kernel]: seconds (share)" for the `top` costliest steps of a profiled plan.
  std::string profile_report(int top) const;
  int64_t activation_bytes() const { return activation_bytes_; }
  // What the kernels allocated for themselves when prepared (KernelSpec::scratch_bytes).
  int64_t kernel_bytes() const { return kernel_bytes_; }
  // The largest request a kernel makes of the stream's shared workspace (KernelSpec::workspace_bytes;
  // 0 on the CPU, where kernels count their scratch in kernel_bytes).
  int64_t workspace_bytes() const { return workspace_bytes_; }
  // The plan's own input tensors (a batch of images, labels, the learning rate).
  int64_t input_bytes() const { return input_bytes_; }
  // Device graphs: whether run() replays a captured graph now, and why not when capture failed.
  bool replaying_graph() const { return device_graph_ != nullptr; }
  const std::string& device_graph_failure() const { return device_graph_failure_; }

 private:
  void bind_values(ParamStore& store);
  void plan_activations(const std::vector<Value>& fetches);
  // Orders every in-place update after the earlier steps that read what it writes and before the
  // later ones (PlanStep::after), as a serial run orders them.
  void order_in_place_updates();
  void choose_kernels(const PlanOptions& options);
  bool run_device_graph();

  const Graph graph_;  // a copy: the builder's graph may change or go; its handles work on this one
  std::vector<Tensor> tensors_;  // by value id
  std::vector<bool> readable_;   // by value id: what tensor() hands out
  std::vector<PlanStep> steps_;
  int64_t activation_bytes_ = 0;
  int64_t kernel_bytes_ = 0;
  int64_t workspace_bytes_ = 0;
  int64_t input_bytes_ = 0;
  Device device_;
  std::shared_ptr<ExecContext> context_;
  bool profile_ = false;
  Trace* trace_ = nullptr;
  int trace_learner_ = -1;
  int64_t trace_step_offset_ = 0;  // added to the run index in trace events
  int64_t runs_ = 0;
  // Device graphs: on when asked for and the plan is on a device; eager runs since the last
  // (re)capture; the captured graph; why capture failed (graphs then stay off).
  bool device_graphs_ = false;
  int eager_runs_ = 0;
  std::shared_ptr<void> device_graph_;
  std::string device_graph_failure_;
};

}  // namespace quiver
