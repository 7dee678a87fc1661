// The CUDA kernels of conv2d, conv2d_grad_input and conv2d_grad_weight: cuDNN's legacy
// convolution API on plain NCHW tensors and an OIHW filter, as ops/conv2d.h defines them (square
// stride and padding, no dilation, no bias input: a bias is a separate bias_add node).
// CUDNN_CROSS_CORRELATION is what the CPU kernels compute (no kernel flip). Both gradients
// overwrite their output (beta = 0), as the CPU kernels do.
// Descriptors are built once per Plan in prepare; the algorithm needs a handle, so it is chosen
// from cudnnGet*Algorithm_v7 (a heuristic query: nothing runs, nothing waits) with the plan's
// stream in prepare, where the plan gives one (KernelSpec::context), else at the first call, and
// kept. Chosen in prepare, its workspace is known before anything runs, and memory checks count it. The choice prefers, in this order: a workspace of at most kMaxWorkspaceBytes,
// FP32 FMA math (no TF32 tensor cores, so results match the CPU to float rounding), a
// deterministic algorithm (no atomics: a convolution repeats bit for bit), then cuDNN's speed ranking.
// The workspace comes from the stream's shared scratch buffer.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/conv2d.h"

namespace quiver::cuda {

namespace {

// Algorithms asking for more scratch than this are taken only when nothing else works.
constexpr size_t kMaxWorkspaceBytes = size_t{256} << 20;

// An owned cuDNN descriptor, destroyed with its owner.
template <typename Descriptor, cudnnStatus_t (*Create)(Descriptor*), cudnnStatus_t (*Destroy)(Descriptor)>
class Owned {
 public:
  Owned() { QUIVER_CUDNN_CHECK(Create(&descriptor_)); }
  ~Owned() {
    if (descriptor_) Destroy(descriptor_);
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Descriptor get() const { return descriptor_; }

 private:
  Descriptor descriptor_ = nullptr;
};

using TensorDescriptor = Owned<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDescriptor = Owned<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    Owned<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;

enum class Pass { Forward, BackwardData, BackwardFilter };

std::string shape_text(int64_t a, int64_t b, int64_t c, int64_t d) { return cat("[", a, ",", b, ",", c, ",", d, "]"); }

// One node's convolution: its geometry, descriptors and, after the first call, its algorithm.
struct Convolution {
  Pass pass = Pass::Forward;
  ConvGeometry g;
  bool empty = false;  // some extent is 0: no descriptors, the output is all zeros
  std::unique_ptr<TensorDescriptor> image, result;  // x (B, C, H, W) and y (B, O, OH, OW)
  std::unique_ptr<FilterDescriptor> filter;         // w (O, C, KH, KW)
  std::unique_ptr<ConvolutionDescriptor> conv;
  bool chosen = false;
  int algorithm = 0;  // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t, by pass
  size_t workspace_bytes = 0;

  std::string describe() const {
    return cat("x ", shape_text(g.batch, g.channels, g.height, g.width), ", w ",
               shape_text(g.out_channels, g.channels, g.kernel_h, g.kernel_w), ", y ",
               shape_text(g.batch, g.out_channels, g.out_h, g.out_w), ", stride ", g.stride, ", padding ",
               g.padding);
  }
};

int to_int(int64_t value, const char* what, const Convolution& conv) {
  if (value > std::numeric_limits<int>::max())
    throw Error(cat("cuDNN convolution: ", what, " ", value, " exceeds int (", conv.describe(), ")"));
  return static_cast<int>(value);
}

std::shared_ptr<Convolution> make_convolution(Pass pass, const ConvGeometry& g) {
  auto conv = std::make_shared<Convolution>();
  conv->pass = pass;
  conv->g = g;
  conv->empty = g.batch == 0 || g.channels == 0 || g.out_channels == 0 || g.out_plane() == 0 ||
                g.height == 0 || g.width == 0;
  if (conv->empty) return conv;
  const Convolution& c = *conv;
  // cuDNN's 4-d descriptors hold int extents and at most INT_MAX elements per tensor.
  to_int(g.batch * g.channels * g.height * g.width, "input elements", c);
  to_int(g.batch * g.out_channels * g.out_plane(), "output elements", c);
  to_int(g.out_channels * g.patch(), "weight elements", c);
  conv->image = std::make_unique<TensorDescriptor>();
  conv->result = std::make_unique<TensorDescriptor>();
  conv->filter = std::make_unique<FilterDescriptor>();
  conv->conv = std::make_unique<ConvolutionDescriptor>();
  QUIVER_CUDNN_CHECK(cudnnSetTensor4dDescriptor(conv->image->get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                                to_int(g.batch, "batch", c), to_int(g.channels, "channels", c),
                                                to_int(g.height, "height", c), to_int(g.width, "width", c)));
  QUIVER_CUDNN_CHECK(cudnnSetTensor4dDescriptor(conv->result->get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                                to_int(g.batch, "batch", c), to_int(g.out_channels, "out channels", c),
                                                to_int(g.out_h, "output height", c), to_int(g.out_w, "output width", c)));
  QUIVER_CUDNN_CHECK(cudnnSetFilter4dDescriptor(conv->filter->get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                to_int(g.out_channels, "out channels", c),
                                                to_int(g.channels, "channels", c), to_int(g.kernel_h, "kernel height", c),
                                                to_int(g.kernel_w, "kernel width", c)));
  int padding = to_int(g.padding, "padding", c), stride = to_int(g.stride, "stride", c);
  QUIVER_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv->conv->get(), padding, padding, stride, stride, 1, 1,
                                                     CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  QUIVER_CUDNN_CHECK(cudnnSetConvolutionMathType(conv->conv->get(), CUDNN_FMA_MATH));
  // The output extent is Quiver's (floor division, as ops/conv2d.cpp); cuDNN must agree.
  int n = 0, o = 0, h = 0, w = 0;
  QUIVER_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv->conv->get(), conv->image->get(),
                                                           conv->filter->get(), &n, &o, &h, &w));
  if (n != g.batch || o != g.out_channels || h != g.out_h || w != g.out_w)
    throw Error(cat("cuDNN convolution: cuDNN computes output ", shape_text(n, o, h, w), " for ", c.describe()));
  return conv;
}

// Index of the preferred entry of a cudnnGet*Algorithm_v7 answer (sorted fastest first), or -1
// when none succeeded. Lower penalty wins; ties keep cuDNN's order.
template <typename Perf>
int preferred(const Perf* perf, int count) {
  int best = -1, best_penalty = 0;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    int penalty = (perf[i].memory > kMaxWorkspaceBytes ? 4 : 0) +
                  (perf[i].mathType == CUDNN_TENSOR_OP_MATH ||
                           perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
                       ? 2
                       : 0) +
                  (perf[i].determinism != CUDNN_DETERMINISTIC ? 1 : 0);
    if (best < 0 || penalty < best_penalty) {
      best = i;
      best_penalty = penalty;
    }
  }
  return best;
}

void choose_algorithm(Convolution& conv, cudnnHandle_t handle) {
  cudnnTensorDescriptor_t x = conv.image->get(), y = conv.result->get();
  cudnnFilterDescriptor_t w = conv.filter->get();
  cudnnConvolutionDescriptor_t c = conv.conv->get();
  int returned = 0, best = -1;
  switch (conv.pass) {
    case Pass::Forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      QUIVER_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, x, w, c, y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                                &returned, perf));
      best = preferred(perf, returned);
      if (best < 0) break;
      auto algorithm = perf[best].algo;
      QUIVER_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle, x, w, c, y, algorithm, &conv.workspace_bytes));
      conv.algorithm = static_cast<int>(algorithm);
      break;
    }
    case Pass::BackwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      QUIVER_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          handle, w, y, c, x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf));
      best = preferred(perf, returned);
      if (best < 0) break;
      auto algorithm = perf[best].algo;
      QUIVER_CUDNN_CHECK(
          cudnnGetConvolutionBackwardDataWorkspaceSize(handle, w, y, c, x, algorithm, &conv.workspace_bytes));
      conv.algorithm = static_cast<int>(algorithm);
      break;
    }
    case Pass::BackwardFilter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      QUIVER_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          handle, x, y, c, w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf));
      best = preferred(perf, returned);
      if (best < 0) break;
      auto algorithm = perf[best].algo;
      QUIVER_CUDNN_CHECK(
          cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, x, y, c, w, algorithm, &conv.workspace_bytes));
      conv.algorithm = static_cast<int>(algorithm);
      break;
    }
  }
  if (best < 0)
    throw Error(cat("cuDNN has no algorithm for this convolution (", returned, " candidates, none usable): ",
                    conv.describe()));
  conv.chosen = true;
}

// out <- conv pass of (lhs, rhs); the argument roles follow the pass:
//   Forward:        out y (B, O, OH, OW), lhs x (B, C, H, W),    rhs w (O, C, KH, KW)
//   BackwardData:   out dx (B, C, H, W),  lhs dy (B, O, OH, OW), rhs w (O, C, KH, KW)
//   BackwardFilter: out dw (O, C, KH, KW), lhs dy (B, O, OH, OW), rhs x (B, C, H, W)
void run(Convolution& conv, const StreamContext& stream, float* out, const float* lhs, const float* rhs,
         int64_t out_elements) {
  if (conv.empty) {  // an empty sum (or an empty output): zeros, as the CPU kernels give
    if (out_elements > 0)
      QUIVER_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(out_elements) * sizeof(float), stream.stream()));
    return;
  }
  cudnnHandle_t handle = stream.cudnn();
  if (!conv.chosen) choose_algorithm(conv, handle);
  void* workspace = conv.workspace_bytes > 0 ? stream.workspace(static_cast<int64_t>(conv.workspace_bytes)) : nullptr;
  const float alpha = 1.0f, beta = 0.0f;  // beta 0: the output is overwritten, never read
  cudnnTensorDescriptor_t x = conv.image->get(), y = conv.result->get();
  cudnnFilterDescriptor_t w = conv.filter->get();
  cudnnConvolutionDescriptor_t c = conv.conv->get();
  switch (conv.pass) {
    case Pass::Forward:
      QUIVER_CUDNN_CHECK(cudnnConvolutionForward(handle, &alpha, x, lhs, w, rhs, c,
                                                 static_cast<cudnnConvolutionFwdAlgo_t>(conv.algorithm), workspace,
                                                 conv.workspace_bytes, &beta, y, out));
      break;
    case Pass::BackwardData:
      QUIVER_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &alpha, w, rhs, y, lhs, c,
                                                      static_cast<cudnnConvolutionBwdDataAlgo_t>(conv.algorithm),
                                                      workspace, conv.workspace_bytes, &beta, x, out));
      break;
    case Pass::BackwardFilter:
      QUIVER_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, &alpha, x, rhs, y, lhs, c,
                                                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(conv.algorithm),
                                                        workspace, conv.workspace_bytes, &beta, w, out));
      break;
  }
}

ConvGeometry geometry_of(const KernelSpec& spec, const Shape& x, const Shape& w) {
  return conv_geometry(x, w, spec.node.attrs.get_int("stride", 1), spec.node.attrs.get_int("padding", 0));
}

// dy must have the forward output's shape; the CPU kernels assume it, cuDNN would misread it.
void expect_output_grad(const KernelSpec& spec, const ConvGeometry& g) {
  Shape expected{g.batch, g.out_channels, g.out_h, g.out_w};
  if (spec.input(0).shape != expected)
    throw Error(cat(spec.node.op, " '", spec.node.name, "': dy ", spec.input(0).shape.str(), " but the convolution ",
                    "of x [", g.batch, ",", g.channels, ",", g.height, ",", g.width, "] gives ", expected.str()));
}

// The KernelFn of one node; errors while building its descriptors name the node.
KernelFn kernel_for(const KernelSpec& spec, Pass pass, const ConvGeometry& g) {
  std::shared_ptr<Convolution> conv;
  try {
    conv = make_convolution(pass, g);
    const auto* stream = dynamic_cast<const StreamContext*>(spec.context);
    if (stream && !conv->empty) {
      use_device(stream->device());
      choose_algorithm(*conv, stream->cudnn());
      spec.workspace_bytes = static_cast<int64_t>(conv->workspace_bytes);
    }
  } catch (const Error& error) {
    throw Error(cat(spec.node.op, " '", spec.node.name, "': ", error.what()));
  }
  return [conv](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    run(*conv, stream, call.outputs[0].f32(), call.inputs[0].f32(), call.inputs[1].f32(), call.outputs[0].numel());
  };
}

KernelFn prepare_conv_forward(const KernelSpec& spec) {
  // inputs: x (B, C, H, W), w (O, C, KH, KW); output y (B, O, OH, OW)
  return kernel_for(spec, Pass::Forward, geometry_of(spec, spec.input(0).shape, spec.input(1).shape));
}

KernelFn prepare_grad_input(const KernelSpec& spec) {
  // inputs: dy (B, O, OH, OW), w (O, C, KH, KW); output dx (B, C, H, W)
  ConvGeometry g = geometry_of(spec, spec.output(0).shape, spec.input(1).shape);
  expect_output_grad(spec, g);
  return kernel_for(spec, Pass::BackwardData, g);
}

KernelFn prepare_grad_weight(const KernelSpec& spec) {
  // inputs: dy (B, O, OH, OW), x (B, C, H, W); output dw (O, C, KH, KW)
  ConvGeometry g = geometry_of(spec, spec.input(1).shape, spec.output(0).shape);
  expect_output_grad(spec, g);
  return kernel_for(spec, Pass::BackwardFilter, g);
}

const bool conv2d_kernels_registered = [] {
  OpRegistry& registry = OpRegistry::global();
  registry.add_kernel("conv2d", cuda_kernel("cudnn", prepare_conv_forward));
  registry.add_kernel("conv2d_grad_input", cuda_kernel("cudnn", prepare_grad_input));
  registry.add_kernel("conv2d_grad_weight", cuda_kernel("cudnn", prepare_grad_weight));
  return true;
}();

}  // namespace

}  // namespace quiver::cuda
