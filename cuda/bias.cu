// CUDA kernels of bias_add and bias_grad (ops/bias.h). x is viewed as (outer, channels, inner);
// bias_grad sums each channel in a fixed order (cuda/block_reduce.cuh), in double as the CPU
// kernel does, so a result repeats run to run.
#include <algorithm>
#include <cstdint>

#include "cuda/block_reduce.cuh"
#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/bias.h"
#include "ops/elementwise.h"

namespace quiver::cuda {

namespace {

__global__ void bias_add_kernel(float* dst, const float* src, const float* bias, int64_t count,
                                int64_t channels, int64_t inner) {
  for (int64_t i = first_index(); i < count; i += grid_stride())
    dst[i] = math::add(src[i], bias[(i / inner) % channels]);
}

// One block per channel: each thread sums a strided share of the channel's (outer, inner)
// elements, then the block adds the shares in a fixed order (double, as the CPU's outer sum).
__global__ void bias_grad_kernel(float* dbias, const float* dy, int64_t outer, int64_t channels,
                                 int64_t inner) {
  __shared__ double shared[kThreadsPerBlock];
  const int64_t c = blockIdx.x, per_channel = outer * inner;
  double sum = 0.0;
  for (int64_t k = threadIdx.x; k < per_channel; k += blockDim.x) {
    int64_t o = k / inner, i = k - o * inner;
    sum += dy[(o * channels + c) * inner + i];
  }
  sum = block_reduce(sum, shared, Sum{});
  if (threadIdx.x == 0) dbias[c] = static_cast<float>(sum);
}

KernelFn prepare_bias_add(const KernelSpec& spec) {
  BiasGeometry g = bias_geometry(spec.input(0).shape);
  return [g](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    int64_t count = call.outputs[0].numel();
    if (count == 0) return;
    bias_add_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream.stream()>>>(
        call.outputs[0].f32(),  // (outer, C, inner)
        call.inputs[0].f32(),   // (outer, C, inner)
        call.inputs[1].f32(),   // (C)
        count, g.channels, g.inner);
    QUIVER_CUDA_CHECK_LAUNCH();
  };
}

KernelFn prepare_bias_grad(const KernelSpec& spec) {
  BiasGeometry g = bias_geometry(spec.input(0).shape);
  return [g](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    if (g.channels == 0) return;
    bias_grad_kernel<<<static_cast<unsigned>(g.channels), reduction_threads(g.outer * g.inner), 0,
                       stream.stream()>>>(call.outputs[0].f32(),  // (C)
                                          call.inputs[0].f32(),   // (outer, C, inner)
                                          g.outer, g.channels, g.inner);
    QUIVER_CUDA_CHECK_LAUNCH();
  };
}

const bool bias_kernels_registered = [] {
  OpRegistry& registry = OpRegistry::global();
  registry.add_kernel("bias_add", cuda_kernel("cuda", prepare_bias_add));
  registry.add_kernel("bias_grad", cuda_kernel("cuda", prepare_bias_grad));
  return true;
}();

}  // namespace

}  // namespace quiver::cuda
