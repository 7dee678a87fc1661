// The CUDA kernels of max_pool2d and max_pool2d_grad, written out rather than taken from cuDNN
// so that they agree with ops/pool.cpp exactly: a square window, no padding, ties to the first
// maximum in row-major window order (math::max_pool_argmax in ops/pool.h: a strictly greater
// value replaces the best, and the first NaN wins over any number), the argmax recorded as an
// int32 index into the H*W plane, and a gradient that routes dy through that argmax only.
// The gradient is a gather, one thread per input element, never an atomic scatter: windows
// overlap when stride < kernel, and the thread adds the dy of each window that chose its element
// in ascending output order starting from 0, the order in which the CPU kernel accumulates,
// so the result is deterministic and bit for bit the CPU's. It overwrites dx.
#include <cstdint>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/pool.h"

namespace quiver::cuda {

namespace {

// One thread per output element.
__global__ void max_pool_kernel(float* y, int32_t* argmax, const float* x, PoolGeometry g) {
  // y, argmax (B*C, OH, OW); x (B*C, H, W)
  int64_t count = g.planes * g.out_plane();
  for (int64_t out = first_index(); out < count; out += grid_stride()) {
    int64_t p = out / g.out_plane();
    int64_t oh = out % g.out_plane() / g.out_w;
    int64_t ow = out % g.out_w;
    const float* plane = x + p * g.plane();
    const int64_t best = math::max_pool_argmax(plane, g, oh, ow);
    y[out] = plane[best];
    argmax[out] = static_cast<int32_t>(best);
  }
}

// First output index along one axis whose window [o*stride, o*stride + kernel) holds `i`.
__device__ inline int64_t first_window(int64_t i, int64_t kernel, int64_t stride) {
  return i < kernel ? 0 : (i - kernel) / stride + 1;
}

// One thread per input element: the sum of dy over the windows whose argmax is this element.
__global__ void max_pool_grad_kernel(float* dx, const float* dy, const int32_t* argmax, PoolGeometry g) {
  // dx (B*C, H, W); dy, argmax (B*C, OH, OW)
  int64_t count = g.planes * g.plane();
  for (int64_t in = first_index(); in < count; in += grid_stride()) {
    int64_t p = in / g.plane();
    int64_t at = in % g.plane();
    int64_t ih = at / g.width, iw = at % g.width;
    int64_t oh_last = min(ih / g.stride, g.out_h - 1), ow_last = min(iw / g.stride, g.out_w - 1);
    int64_t ow_first = first_window(iw, g.kernel, g.stride);
    const float* dy_plane = dy + p * g.out_plane();
    const int32_t* argmax_plane = argmax + p * g.out_plane();
    float sum = 0.0f;
    for (int64_t oh = first_window(ih, g.kernel, g.stride); oh <= oh_last; ++oh)
      for (int64_t ow = ow_first; ow <= ow_last; ++ow) {
        int64_t out = oh * g.out_w + ow;
        if (argmax_plane[out] == at) sum += dy_plane[out];
      }
    dx[in] = sum;
  }
}

KernelFn prepare_max_pool(const KernelSpec& spec) {
  PoolGeometry g = pool_geometry(spec.input(0).shape, spec.node.attrs);
  return [g](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    int64_t count = g.planes * g.out_plane();
    if (count == 0) return;
    max_pool_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream.stream()>>>(
        call.outputs[0].f32(), call.outputs[1].i32(), call.inputs[0].f32(), g);
    QUIVER_CUDA_CHECK_LAUNCH();
  };
}

KernelFn prepare_max_pool_grad(const KernelSpec& spec) {
  // inputs: dy (B, C, OH, OW), argmax (B, C, OH, OW); output dx (B, C, H, W)
  const Shape& x = spec.output(0).shape;
  PoolGeometry g = pool_geometry(x, spec.node.attrs);
  Shape pooled{x[0], x[1], g.out_h, g.out_w};
  if (spec.input(0).shape != pooled || spec.input(1).shape != pooled)
    throw Error(cat(spec.node.op, " '", spec.node.name, "': dy ", spec.input(0).shape.str(), " and argmax ",
                    spec.input(1).shape.str(), " must both be ", pooled.str(), ", the pooling of ", x.str()));
  return [g](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    int64_t count = g.planes * g.plane();
    if (count == 0) return;
    max_pool_grad_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream.stream()>>>(
        call.outputs[0].f32(), call.inputs[0].f32(), call.inputs[1].i32(), g);
    QUIVER_CUDA_CHECK_LAUNCH();
  };
}

const bool pool_kernels_registered = [] {
  OpRegistry& registry = OpRegistry::global();
  registry.add_kernel("max_pool2d", cuda_kernel("cuda", prepare_max_pool));
  registry.add_kernel("max_pool2d_grad", cuda_kernel("cuda", prepare_max_pool_grad));
  return true;
}();

}  // namespace

}  // namespace quiver::cuda
