// Every registered op kind: its CUDA kernel against its CPU kernel, node by node.
// A case is an op-harness OpCase (tests/ops/op_harness.h): its inputs and builder, closed into the
// harness's loss sum(y * R), with the backward and, for some cases, an optimizer update. The graph
// runs once on a CPU plan, and just before each node runs its inputs are recorded; so forward,
// gradient and update nodes are all fed consistent, realistic values (valid argmax indices, labels
// in range, a real LSTM cache). Each recorded node then runs through the CPU kernel a CPU plan
// would choose and the CUDA kernel a CUDA plan would choose, and the outputs (and the inputs an
// in-place update writes) must agree. Forward and backward ops are separate kinds, so covering
// every kind covers both directions.
// The registry checks need no device and run in CI; the comparisons skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/autodiff.h"
#include "core/device.h"
#include "core/error.h"
#include "core/op.h"
#include "runtime/param_store.h"
#include "runtime/plan.h"
#include "tests/ops/op_harness.h"

namespace quiver::testing {
namespace {

// CUDA vs CPU: |cuda - cpu| <= kRelative * |cpu| + kAbsolute * max(1, max |cpu| over the tensor).
// The two sides run the same float32 arithmetic in different orders (cuBLAS/cuDNN vs oneDNN
// blocking, tree reductions vs serial loops) and with different transcendental implementations
// (CUDA's expf/tanhf are within 2 ulp); the cuDNN kernels use FMA math, never TF32. The largest
// reductions here have about 100 terms of size <= 1, so each side's rounding error is a few 1e-6
// of the terms' scale: 1e-4 relative is ample for results of ordinary size, and the absolute
// part, scaled by the tensor's magnitude, covers results that cancel to near zero (their error is
// set by the size of the terms, not of the sum). A kernel bug (a wrong index, a dropped term, a
// missed step) is off by far more.
constexpr double kRelative = 1e-4;
constexpr double kAbsolute = 1e-5;

#define SKIP_WITHOUT_CUDA_DEVICE()                                                               \
  do {                                                                                           \
    if (device_backend(DeviceKind::CUDA) == nullptr)                                             \
      GTEST_SKIP() << "no CUDA device: this build has no CUDA backend";                          \
    if (device_backend(DeviceKind::CUDA)->device_count() == 0)                                   \
      GTEST_SKIP() << "no CUDA device: the CUDA backend sees none (no GPU or no driver)";        \
  } while (0)

enum class Update { None, Sgd, Adam };

struct DeviceCase {
  OpCase op;  // name, inputs and builder; the harness's reference is not used here
  Update update = Update::None;
};

void PrintTo(const DeviceCase& device_case, std::ostream* out) { *out << device_case.op.name; }

void write(const Tensor& tensor, const Host& values) {
  for (int64_t k = 0; k < tensor.numel(); ++k) {
    if (tensor.dtype() == DType::I32)
      tensor.i32()[k] = static_cast<int32_t>(values[k]);
    else
      tensor.f32()[k] = static_cast<float>(values[k]);
  }
}

Tensor cpu_copy(const Tensor& tensor) {
  Tensor copy = Tensor::empty(tensor.shape(), tensor.dtype());
  copy.copy_from(tensor);
  return copy;
}

// The case's graph: y = op(inputs); loss = sum(y * R) (as the harness builds it); the backward;
// and the case's optimizer update, if any. Float case inputs are parameters, labels graph inputs.
struct CaseGraph {
  GraphBuilder builder;
  std::vector<Value> fetches;  // y, the loss and every parameter's gradient

  explicit CaseGraph(const DeviceCase& device_case) {
    const OpCase& op_case = device_case.op;
    std::vector<Value> inputs;
    for (size_t i = 0; i < op_case.inputs.size(); ++i) {
      const InputSpec& spec = op_case.inputs[i];
      const std::string name = "in" + std::to_string(i);
      inputs.push_back(spec.draw == Draw::Labels ? builder.input(name, spec.shape, DType::I32)
                                                 : builder.parameter(name, spec.shape, ParamInit::zeros()));
    }
    const Value output = op_case.build(builder, inputs);
    const int64_t count = builder.shape(output).numel();
    const Value flat = builder.reshape(output, Shape{1, count}, "flat");
    const Value weights = builder.input("R", Shape{count, 1});
    const Value loss = builder.reshape(builder.matmul(flat, weights, false, false, "dot"), Shape{}, "loss");
    build_backward(builder, loss);
    fetches = {output, loss};
    for (const ParamInfo& param : builder.graph().params()) fetches.push_back(Value{param.grad});
    if (device_case.update == Update::Sgd) {
      add_sgd_update(builder, builder.input("learning_rate", Shape{1}), SgdOptions{0.9, 0.01});
    } else if (device_case.update == Update::Adam) {
      const Value rate = builder.input("learning_rate", Shape{1});
      const Value step = builder.input("step", Shape{1});
      AdamOptions adam;
      adam.weight_decay = 0.01;
      add_adam_update(builder, rate, step, adam);
    }
  }
};

struct RecordedNode {
  NodeId node = -1;
  std::vector<Tensor> inputs;  // CPU copies of the node's inputs just before it ran
};

// Runs the case's graph on a CPU plan, one step at a time, recording every step's inputs.
std::vector<RecordedNode> record_on_cpu(const DeviceCase& device_case, const Graph& graph,
                                        const std::vector<Value>& fetches, uint64_t seed) {
  ParamStore store(graph);
  Plan plan(graph, store, fetches);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::set<ValueId> drawn;
  for (size_t i = 0; i < device_case.op.inputs.size(); ++i) {
    const ValueInfo& info = graph.value(graph.find("in" + std::to_string(i)));
    const Tensor& tensor = info.role == ValueRole::Input ? plan.input(info.name) : store.param(info.param_index);
    write(tensor, draw_values(device_case.op.inputs[i], rng));
    drawn.insert(info.id);
  }
  for (const ValueInfo& info : graph.values()) {
    if (drawn.count(info.id)) continue;
    if (info.role == ValueRole::Input && info.dtype == DType::F32) {
      // Adam at step 3, past the first step's special case; any other input (R, a case's own
      // sequence) U(-1, 1).
      Host values(info.shape.numel());
      for (double& v : values) v = info.name == "learning_rate" ? 0.05 : info.name == "step" ? 3.0 : unit(rng);
      write(plan.input(info.name), values);
    } else if (info.role == ValueRole::State) {
      // Optimizer state mid-training rather than zero, so momentum and moments enter the update;
      // second moments are non-negative.
      Host values(info.shape.numel());
      for (double& v : values) v = info.state_kind == "adam_v" ? 0.01 * std::abs(unit(rng)) : 0.1 * unit(rng);
      write(store.state(info.state_kind, info.param_index), values);
    }
  }
  std::vector<RecordedNode> recorded;
  const int64_t run = plan.begin_run();
  for (int position = 0; position < static_cast<int>(plan.steps().size()); ++position) {
    const PlanStep& step = plan.steps()[position];
    RecordedNode node;
    node.node = step.node;
    for (const Tensor& input : step.inputs) node.inputs.push_back(cpu_copy(input));
    recorded.push_back(std::move(node));
    plan.run_step(position, plan.context(), run);
  }
  return recorded;
}

// The kernel a plan on `device` would choose: the first of that device that does not decline.
const KernelImpl* chosen_kernel(const OpDef& def, DeviceKind device, const KernelSpec& spec, std::string& declined) {
  for (const KernelImpl& impl : def.kernels) {
    if (impl.device != device) continue;
    const std::string why = impl.declines ? impl.declines(spec) : "";
    if (why.empty()) return &impl;
    declined += cat(" ", impl.name, ": ", why, ";");
  }
  return nullptr;
}

// Outputs start as garbage a kernel must overwrite: NaN for floats (and every compared value must
// be finite), a different invalid index on each side for int32 (argmax).
void poison(const Tensor& tensor, int side) {
  tensor.fill(tensor.dtype() == DType::F32 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(-1 - side));
}

void expect_match(const Tensor& cuda, const Tensor& cpu, const std::string& what) {
  ASSERT_EQ(cuda.shape(), cpu.shape()) << what;
  ASSERT_EQ(cuda.dtype(), cpu.dtype()) << what;
  if (cpu.dtype() == DType::I32) {
    for (int64_t k = 0; k < cpu.numel(); ++k)
      ASSERT_EQ(cuda.i32()[k], cpu.i32()[k]) << what << " element " << k << " of " << cpu.shape().str();
    return;
  }
  double scale = 1.0;
  for (int64_t k = 0; k < cpu.numel(); ++k) {
    ASSERT_TRUE(std::isfinite(cpu.f32()[k]))
        << what << " element " << k << ": the CPU kernel left it unwritten or made " << cpu.f32()[k];
    scale = std::max(scale, std::fabs(static_cast<double>(cpu.f32()[k])));
  }
  for (int64_t k = 0; k < cpu.numel(); ++k) {
    const double expected = cpu.f32()[k], actual = cuda.f32()[k];
    ASSERT_TRUE(std::isfinite(actual)) << what << " element " << k << ": the CUDA kernel left it unwritten or made "
                                       << actual << " (CPU: " << expected << ")";
    ASSERT_NEAR(actual, expected, kRelative * std::fabs(expected) + kAbsolute * scale)
        << what << " element " << k << " of " << cpu.shape().str();
  }
}

// One recorded node through both kernels, on fresh copies of the same inputs.
void expect_cuda_matches_cpu(const Graph& graph, const RecordedNode& recorded, DeviceBackend& backend,
                             const ExecContext& stream) {
  const Node& node = graph.node(recorded.node);
  const OpDef& def = OpRegistry::global().get(node.op);
  const KernelSpec spec{graph, node};
  std::string declined;
  const KernelImpl* cpu = chosen_kernel(def, DeviceKind::CPU, spec, declined);
  const KernelImpl* cuda = chosen_kernel(def, DeviceKind::CUDA, spec, declined);
  ASSERT_NE(cpu, nullptr) << node.op << " '" << node.name << "': no CPU kernel accepts it;" << declined;
  ASSERT_NE(cuda, nullptr) << node.op << " '" << node.name << "': no CUDA kernel accepts it;" << declined;
  const std::string what = cat(node.op, " '", node.name, "' [cpu ", cpu->name, " vs cuda ", cuda->name, "]");

  std::vector<Tensor> cpu_inputs, cpu_outputs;
  for (const Tensor& input : recorded.inputs) cpu_inputs.push_back(cpu_copy(input));
  for (ValueId output : node.outputs) {
    const ValueInfo& info = graph.value(output);
    cpu_outputs.push_back(Tensor::empty(info.shape, info.dtype));
    poison(cpu_outputs.back(), 0);
  }
  SerialContext serial;
  cpu->prepare(spec)(KernelCall{serial, node, cpu_inputs, cpu_outputs});

  // Inputs (learning rate and Adam's step included: they are input tensors too) go to the device
  // through the stream, so the kernel queued after them sees them.
  const Device gpu = Device::cuda(0);
  std::vector<Tensor> gpu_inputs, gpu_outputs;
  for (const Tensor& input : recorded.inputs) {
    gpu_inputs.push_back(Tensor::empty(input.shape(), input.dtype(), gpu));
    if (input.bytes() > 0) backend.upload(stream, gpu_inputs.back().raw(), input.raw(), input.bytes());
  }
  for (ValueId output : node.outputs) {
    const ValueInfo& info = graph.value(output);
    gpu_outputs.push_back(Tensor::empty(info.shape, info.dtype, gpu));
    poison(gpu_outputs.back(), 1);
  }
  const KernelFn kernel = cuda->prepare(spec);
  kernel(KernelCall{stream, node, gpu_inputs, gpu_outputs});
  backend.synchronize(stream);

  auto downloaded = [&](const Tensor& device_tensor) {
    Tensor host = Tensor::empty(device_tensor.shape(), device_tensor.dtype());
    if (host.bytes() > 0) backend.download(stream, host.raw(), device_tensor.raw(), device_tensor.bytes());
    return host;
  };
  for (size_t i = 0; i < node.outputs.size(); ++i)
    expect_match(downloaded(gpu_outputs[i]), cpu_outputs[i],
                 cat(what, " output ", i, " '", graph.value(node.outputs[i]).name, "'"));
  if (def.updates_in_place())
    for (size_t i = 0; i < node.inputs.size(); ++i)
      expect_match(downloaded(gpu_inputs[i]), cpu_inputs[i],
                   cat(what, " input ", i, " '", graph.value(node.inputs[i]).name, "' after the update"));
}

// ---- the cases ---------------------------------------------------------------------------------

using Build = std::function<Value(GraphBuilder&, const std::vector<Value>&)>;

DeviceCase make_case(std::string name, std::vector<InputSpec> inputs, Build build, Update update = Update::None) {
  DeviceCase device_case;
  device_case.op.name = std::move(name);
  device_case.op.inputs = std::move(inputs);
  device_case.op.build = std::move(build);
  device_case.update = update;
  if (update == Update::Sgd) device_case.op.name += "_sgd";
  if (update == Update::Adam) device_case.op.name += "_adam";
  return device_case;
}

DeviceCase matmul_case(bool ta, bool tb, Update update = Update::None) {
  const int64_t m = 5, n = 7, k = 6;
  return make_case(std::string("matmul") + (ta ? "_ta" : "") + (tb ? "_tb" : ""),
                   {{ta ? Shape{k, m} : Shape{m, k}}, {tb ? Shape{n, k} : Shape{k, n}}},
                   [=](GraphBuilder& b, const std::vector<Value>& in) { return b.matmul(in[0], in[1], ta, tb); },
                   update);
}

DeviceCase elementwise_case(const std::string& kind, int arity, Draw draw = Draw::Smooth, Shape shape = Shape{4, 9}) {
  std::vector<InputSpec> inputs(arity, InputSpec{shape, draw});
  return make_case(shape == Shape{4, 9} ? kind : kind + shape.str(), inputs,
                   [kind](GraphBuilder& b, const std::vector<Value>& in) { return b.apply1(kind, in); });
}

DeviceCase bias_add_case(Shape x, Update update = Update::None) {
  return make_case("bias_add" + x.str(), {{x}, {Shape{x[1]}}},
                   [](GraphBuilder& b, const std::vector<Value>& in) { return b.bias_add(in[0], in[1]); }, update);
}

DeviceCase conv_case(Shape x, Shape w, int64_t stride, int64_t padding, Update update = Update::None) {
  return make_case(cat("conv2d", x.str(), w.str(), "_s", stride, "_p", padding), {{x}, {w}},
                   [=](GraphBuilder& b, const std::vector<Value>& in) {
                     return b.conv2d(in[0], in[1], Conv2dAttrs{stride, padding});
                   },
                   update);
}

DeviceCase max_pool_case(Shape x, int64_t kernel, int64_t stride) {
  return make_case(cat("max_pool2d", x.str(), "_k", kernel, "_s", stride), {{x, Draw::Distinct}},
                   [=](GraphBuilder& b, const std::vector<Value>& in) { return b.max_pool2d(in[0], kernel, stride); });
}

DeviceCase softmax_ce_case(int64_t batch = 6, int64_t classes = 5) {
  return make_case(batch == 6 && classes == 5 ? std::string("softmax_cross_entropy")
                                              : cat("softmax_cross_entropy_", batch, "x", classes),
                   {{Shape{batch, classes}}, {Shape{batch}, Draw::Labels, classes}},
                   [](GraphBuilder& b, const std::vector<Value>& in) { return b.softmax_cross_entropy(in[0], in[1]); });
}

std::vector<InputSpec> lstm_weights(int64_t input, int64_t hidden) {
  return {{Shape{input, 4 * hidden}}, {Shape{hidden, 4 * hidden}}, {Shape{4 * hidden}}};
}

// x is a parameter: lstm_grad computes dx too.
DeviceCase lstm_case(int64_t batch, int64_t steps, int64_t input, int64_t hidden, Update update = Update::None) {
  std::vector<InputSpec> inputs = lstm_weights(input, hidden);
  inputs.insert(inputs.begin(), InputSpec{Shape{batch, steps, input}});
  return make_case(cat("lstm_B", batch, "_T", steps, "_I", input, "_H", hidden), inputs,
                   [](GraphBuilder& b, const std::vector<Value>& in) { return b.lstm(in[0], in[1], in[2], in[3]); },
                   update);
}

// As in the LSTM model: x is the batch (a graph input, so lstm_grad skips dx, input_grad=0) and
// only the last step's h reaches the loss, so earlier steps get their gradient through time only.
DeviceCase lstm_last_step_case() {
  const int64_t batch = 2, steps = 4, input = 3, hidden = 5;
  return make_case("lstm_last_step", lstm_weights(input, hidden), [=](GraphBuilder& b, const std::vector<Value>& in) {
    const Value x = b.input("sequence", Shape{batch, steps, input});
    return b.select_step(b.lstm(x, in[0], in[1], in[2]), -1);
  });
}

DeviceCase select_step_case(int64_t step) {
  return make_case(cat("select_step_", step < 0 ? "last" : std::to_string(step)), {{Shape{3, 4, 5}}},
                   [step](GraphBuilder& b, const std::vector<Value>& in) { return b.select_step(in[0], step); });
}

std::vector<DeviceCase> all_cases() {
  return {
      matmul_case(false, false, Update::Sgd), matmul_case(true, false), matmul_case(false, true),
      matmul_case(true, true),
      elementwise_case("add", 2), elementwise_case("mul", 2),
      elementwise_case("relu", 1, Draw::AwayFromZero),  // relu_grad: no element at the kink
      elementwise_case("sigmoid", 1), elementwise_case("tanh", 1),
      bias_add_case(Shape{4, 6}), bias_add_case(Shape{2, 3, 4, 5}, Update::Sgd),
      conv_case(Shape{2, 3, 7, 7}, Shape{4, 3, 3, 3}, 1, 1),
      conv_case(Shape{2, 2, 8, 8}, Shape{3, 2, 3, 3}, 2, 1, Update::Adam),  // stride 2 with padding
      conv_case(Shape{1, 3, 9, 9}, Shape{2, 3, 5, 5}, 2, 2),                // stride 2, odd size, 5x5
      conv_case(Shape{1, 1, 6, 6}, Shape{2, 1, 5, 5}, 1, 2),                // the CNN's 5x5, pad 2
      max_pool_case(Shape{2, 3, 6, 6}, 2, 2), max_pool_case(Shape{1, 2, 7, 7}, 3, 2),  // overlapping windows
      softmax_ce_case(),
      // Beyond one block and one pass of a reduction (the cases above fit in one): grid-stride
      // loops, several blocks, strided sums in the block reductions, more rows than threads; and
      // pooling that leaves a row and a column uncovered (9 by 2s) or skips between windows (s 3).
      elementwise_case("add", 2, Draw::Smooth, Shape{3, 1001}), elementwise_case("tanh", 1, Draw::Smooth, Shape{7, 5003}),
      bias_add_case(Shape{3, 5, 17, 19}), softmax_ce_case(300, 1000),
      max_pool_case(Shape{1, 2, 9, 9}, 2, 2), max_pool_case(Shape{2, 2, 8, 8}, 2, 3),
      lstm_case(2, 1, 3, 4),                 // one step
      lstm_case(3, 5, 4, 3, Update::Adam),   // several steps
      lstm_last_step_case(),
      select_step_case(-1), select_step_case(1),
      make_case("reshape", {{Shape{2, 3, 4}}},
                [](GraphBuilder& b, const std::vector<Value>& in) { return b.reshape(in[0], Shape{4, 6}); }),
      make_case("copy", {{Shape{3, 5}}},
                [](GraphBuilder& b, const std::vector<Value>& in) { return b.apply1("copy", {in[0]}); }),
      // fill beyond the backward's scalar seed: a (3, 5) constant.
      make_case("fill", {{Shape{3, 5}}},
                [](GraphBuilder& b, const std::vector<Value>& in) { return b.mul(in[0], b.fill(Shape{3, 5}, 0.75)); }),
  };
}

// ---- tests -------------------------------------------------------------------------------------

// Runs without a device: every registered kind has a CUDA kernel, so a CUDA plan never stops at
// "no CUDA kernel accepts this node" for want of one. (Whether one accepts a given node is what
// the device tests below find out.)
TEST(CudaOpRegistry, EveryRegisteredKindHasACudaKernel) {
#ifdef QUIVER_HAS_CUDA
  ASSERT_NE(device_backend(DeviceKind::CUDA), nullptr) << "a CUDA build registers its backend at load time";
#else
  if (device_backend(DeviceKind::CUDA) == nullptr) GTEST_SKIP() << "this build has no CUDA backend, so no CUDA kernels";
#endif
  const OpRegistry& registry = OpRegistry::global();
  ASSERT_FALSE(registry.kinds().empty());
  for (const std::string& kind : registry.kinds()) {
    int cuda_kernels = 0;
    for (const KernelImpl& impl : registry.get(kind).kernels) {
      if (impl.device != DeviceKind::CUDA) continue;
      ++cuda_kernels;
      EXPECT_TRUE(static_cast<bool>(impl.prepare)) << kind << ": CUDA kernel '" << impl.name << "' has no prepare";
    }
    EXPECT_GT(cuda_kernels, 0) << "op kind '" << kind << "' has no CUDA kernel (register one in cuda/<op family>.cu)";
  }
  EXPECT_TRUE(registry.orphan_kernel_kinds().empty()) << "a CUDA kernel names an op kind that is not registered";
}

// Runs without a device: the cases' CPU runs (what the device test records) reach every
// registered kind, so the device test compares them all; a new op without a case fails here.
TEST(CudaOpRegistry, CasesRunEveryRegisteredKind) {
  std::set<std::string> compared;
  for (const DeviceCase& device_case : all_cases()) {
    CaseGraph graph(device_case);
    const Graph& g = graph.builder.graph();
    for (const RecordedNode& node : record_on_cpu(device_case, g, graph.fetches, 7)) compared.insert(g.node(node.node).op);
  }
  for (const std::string& kind : OpRegistry::global().kinds())
    EXPECT_TRUE(compared.count(kind)) << "op kind '" << kind
                                      << "' is registered but no case in tests/cuda/test_cuda_ops.cpp runs it";
}

class CudaOpTest : public ::testing::TestWithParam<DeviceCase> {};

// Every node of the case's graph (forward, backward, update): the CUDA kernel gives what the CPU
// kernel gives on the same inputs.
TEST_P(CudaOpTest, EveryNodeMatchesTheCpuKernel) {
  SKIP_WITHOUT_CUDA_DEVICE();
  DeviceBackend& backend = *device_backend(DeviceKind::CUDA);
  const std::unique_ptr<ExecContext> stream = backend.make_stream(0);
  CaseGraph graph(GetParam());
  const Graph& g = graph.builder.graph();
  const std::vector<RecordedNode> recorded = record_on_cpu(GetParam(), g, graph.fetches, 7);
  ASSERT_FALSE(recorded.empty());
  for (const RecordedNode& node : recorded) {
    SCOPED_TRACE(cat(GetParam().op.name, ": node ", g.node(node.node).name));
    expect_cuda_matches_cpu(g, node, backend, *stream);
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaOpTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<DeviceCase>& info) {
                           std::string name;
                           for (char ch : info.param.op.name)
                             name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return name;
                         });

}  // namespace
}  // namespace quiver::testing
