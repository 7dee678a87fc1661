// CUDA kernels of the optimizer updates over flat buffers (ops/optimizer.h): sgd_update (momentum,
// weight decay) and adam_update, calling the CPU kernels' QUIVER_HD per-element steps. The
// learning rate and Adam's step are device scalars, so a captured CUDA graph replays with the
// values of the day. An Adam step below 1, which the CPU kernel throws for, turns the weights to
// NaN instead (a queued kernel cannot throw).
#include <cstdint>

#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/optimizer.h"

namespace quiver::cuda {

namespace {

// The learning rate and Adam's step are device scalars: read inside the kernel, never on the host.
__global__ void sgd_kernel(float* w, float* v, const float* g, const float* lr, int64_t count,
                           float momentum, float weight_decay) {
  const float rate = lr[0];
  for (int64_t i = first_index(); i < count; i += grid_stride())
    math::sgd_step(w[i], v[i], g[i], rate, momentum, weight_decay);
}

__global__ void adam_kernel(float* w, float* m, float* v, const float* g, const float* lr,
                            const float* step, int64_t count, float beta1, float beta2,
                            float epsilon, float weight_decay) {
  const float rate = lr[0], t = step[0];
  // Once per block, not per element (a block's threads cover one element each): two FP64 pows,
  // slow on GPUs with little FP64, computed by one thread and shared.
  __shared__ math::AdamCorrection shared_correction;
  if (threadIdx.x == 0) shared_correction = math::adam_correction(beta1, beta2, t);
  __syncthreads();
  const math::AdamCorrection correction = shared_correction;
  for (int64_t i = first_index(); i < count; i += grid_stride()) {
    if (!(t >= 1.0f))
      w[i] = kNaN;  // the CPU kernel throws: "step must be >= 1"
    else
      math::adam_step(w[i], m[i], v[i], g[i], rate, beta1, beta2, epsilon, weight_decay, correction);
  }
}

KernelFn prepare_sgd(const KernelSpec& spec) {
  float momentum = static_cast<float>(spec.node.attrs.get_float("momentum", 0.0));
  float weight_decay = static_cast<float>(spec.node.attrs.get_float("weight_decay", 0.0));
  return [momentum, weight_decay](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    int64_t count = call.inputs[0].numel();
    if (count == 0) return;
    sgd_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream.stream()>>>(
        call.inputs[0].f32(),  // w, updated
        call.inputs[2].f32(),  // velocity, updated
        call.inputs[1].f32(),  // gradient
        call.inputs[3].f32(),  // lr ()
        count, momentum, weight_decay);
    QUIVER_CUDA_CHECK_LAUNCH();
  };
}

KernelFn prepare_adam(const KernelSpec& spec) {
  const auto [beta1, beta2, epsilon, weight_decay] = adam_attrs(spec.node.attrs);
  return [=](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    int64_t count = call.inputs[0].numel();
    if (count == 0) return;
    adam_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream.stream()>>>(
        call.inputs[0].f32(),  // w, updated
        call.inputs[2].f32(),  // first moment, updated
        call.inputs[3].f32(),  // second moment, updated
        call.inputs[1].f32(),  // gradient
        call.inputs[4].f32(),  // lr ()
        call.inputs[5].f32(),  // step ()
        count, beta1, beta2, epsilon, weight_decay);
    QUIVER_CUDA_CHECK_LAUNCH();
  };
}

const bool optimizer_kernels_registered = [] {
  OpRegistry& registry = OpRegistry::global();
  registry.add_kernel("sgd_update", cuda_kernel("cuda", prepare_sgd));
  registry.add_kernel("adam_update", cuda_kernel("cuda", prepare_adam));
  return true;
}();

}  // namespace

}  // namespace quiver::cuda
