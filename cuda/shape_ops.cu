// CUDA kernels of the shape ops (ops/shape_ops.h): reshape and copy (a device-to-device copy,
// nothing when the plan made them alias), fill, select_step (one strided 2D copy) and its
// gradient (dy at the step, zero elsewhere, in one pass).
#include <cstdint>

#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/shape_ops.h"

namespace quiver::cuda {

namespace {

// reshape and copy: any dtype, bytes as they are; nothing to do when the plan made them alias.
void copy_kernel(const KernelCall& call) {
  const StreamContext& stream = stream_of(call);
  const Tensor& dst = call.outputs[0];
  const Tensor& src = call.inputs[0];
  if (dst.raw() == src.raw() || dst.bytes() == 0) return;
  QUIVER_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), static_cast<size_t>(dst.bytes()),
                                    cudaMemcpyDeviceToDevice, stream.stream()));
}

KernelFn prepare_fill(const KernelSpec& spec) {
  float value = static_cast<float>(spec.node.attrs.get_float("value"));
  return [value](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    launch_fill(call.outputs[0].f32(), value, call.outputs[0].numel(), stream.stream());
  };
}

int64_t resolve_step(const Shape& x, int64_t step) { return step < 0 ? step + x[1] : step; }

KernelFn prepare_select_step(const KernelSpec& spec) {
  Shape x = spec.input(0).shape;  // (B, T, H)
  int64_t step = resolve_step(x, spec.node.attrs.get_int("step"));
  return [x, step](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    if (x.numel() == 0) return;
    float* dst = call.outputs[0].f32();                     // (B, H)
    const float* src = call.inputs[0].f32() + step * x[2];  // (B, T, H) at step
    // B rows of H floats, from a pitch of T*H to a pitch of H.
    const size_t row_bytes = sizeof(float) * static_cast<size_t>(x[2]);
    QUIVER_CUDA_CHECK(cudaMemcpy2DAsync(dst, row_bytes, src, row_bytes * static_cast<size_t>(x[1]),
                                        row_bytes, static_cast<size_t>(x[0]),
                                        cudaMemcpyDeviceToDevice, stream.stream()));
  };
}

// dx is dy at `step` and zero at every other step: one pass writes both.
__global__ void select_step_grad_kernel(float* dx, const float* dy, int64_t count, int64_t steps,
                                        int64_t hidden, int64_t step) {
  for (int64_t i = first_index(); i < count; i += grid_stride()) {
    int64_t row = i / hidden;  // b * T + t
    int64_t b = row / steps, t = row - b * steps;
    dx[i] = t == step ? dy[b * hidden + (i - row * hidden)] : 0.0f;
  }
}

KernelFn prepare_select_step_grad(const KernelSpec& spec) {
  Shape x = spec.output(0).shape;  // (B, T, H)
  int64_t step = resolve_step(x, spec.node.attrs.get_int("step"));
  return [x, step](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    int64_t count = x.numel();
    if (count == 0) return;
    select_step_grad_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream.stream()>>>(
        call.outputs[0].f32(),  // (B, T, H)
        call.inputs[0].f32(),   // (B, H)
        count, x[1], x[2], step);
    QUIVER_CUDA_CHECK_LAUNCH();
  };
}

const bool shape_kernels_registered = [] {
  OpRegistry& registry = OpRegistry::global();
  registry.add_kernel("reshape", cuda_kernel("cuda", KernelFn(copy_kernel)));
  registry.add_kernel("copy", cuda_kernel("cuda", KernelFn(copy_kernel)));
  registry.add_kernel("fill", cuda_kernel("cuda", prepare_fill));
  registry.add_kernel("select_step", cuda_kernel("cuda", prepare_select_step));
  registry.add_kernel("select_step_grad", cuda_kernel("cuda", prepare_select_step_grad));
  return true;
}();

}  // namespace

}  // namespace quiver::cuda
