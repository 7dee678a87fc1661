// CUDA kernels of the elementwise family (ops/elementwise.h): add, mul, relu, sigmoid, tanh and
// the activations' gradients, one grid-stride kernel each over the same QUIVER_HD per-element
// math as the CPU kernels, so the results agree to float rounding (not bit for bit: nvcc fuses
// multiply-adds, and the device's expf/tanhf differ from glibc's by an ulp or so).
#include <cstdint>

#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/elementwise.h"

namespace quiver::cuda {

namespace {

struct Add {
  __device__ float operator()(float a, float b) const { return math::add(a, b); }
};
struct Mul {
  __device__ float operator()(float a, float b) const { return math::mul(a, b); }
};
struct Relu {
  __device__ float operator()(float x) const { return math::relu(x); }
};
struct Sigmoid {
  __device__ float operator()(float x) const { return math::sigmoid(x); }
};
struct Tanh {
  __device__ float operator()(float x) const { return math::tanh(x); }
};
struct ReluGrad {
  __device__ float operator()(float dy, float y) const { return math::relu_grad(dy, y); }
};
struct SigmoidGrad {
  __device__ float operator()(float dy, float y) const { return math::sigmoid_grad(dy, y); }
};
struct TanhGrad {
  __device__ float operator()(float dy, float y) const { return math::tanh_grad(dy, y); }
};

template <typename Fn>
__global__ void unary_kernel(float* dst, const float* src, int64_t count, Fn fn) {
  for (int64_t i = first_index(); i < count; i += grid_stride()) dst[i] = fn(src[i]);
}

template <typename Fn>
__global__ void binary_kernel(float* dst, const float* lhs, const float* rhs, int64_t count, Fn fn) {
  for (int64_t i = first_index(); i < count; i += grid_stride()) dst[i] = fn(lhs[i], rhs[i]);
}

template <typename Fn>
KernelFn unary() {
  return [](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    int64_t count = call.outputs[0].numel();
    unary_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream.stream()>>>(
        call.outputs[0].f32(), call.inputs[0].f32(), count, Fn{});
    QUIVER_CUDA_CHECK_LAUNCH();
  };
}

template <typename Fn>
KernelFn binary() {
  return [](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    int64_t count = call.outputs[0].numel();
    binary_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream.stream()>>>(
        call.outputs[0].f32(), call.inputs[0].f32(), call.inputs[1].f32(), count, Fn{});
    QUIVER_CUDA_CHECK_LAUNCH();
  };
}

const bool elementwise_kernels_registered = [] {
  OpRegistry& registry = OpRegistry::global();
  registry.add_kernel("add", cuda_kernel("cuda", binary<Add>()));
  registry.add_kernel("mul", cuda_kernel("cuda", binary<Mul>()));
  registry.add_kernel("relu", cuda_kernel("cuda", unary<Relu>()));
  registry.add_kernel("sigmoid", cuda_kernel("cuda", unary<Sigmoid>()));
  registry.add_kernel("tanh", cuda_kernel("cuda", unary<Tanh>()));
  registry.add_kernel("relu_grad", cuda_kernel("cuda", binary<ReluGrad>()));
  registry.add_kernel("sigmoid_grad", cuda_kernel("cuda", binary<SigmoidGrad>()));
  registry.add_kernel("tanh_grad", cuda_kernel("cuda", binary<TanhGrad>()));
  return true;
}();

}  // namespace

}  // namespace quiver::cuda
