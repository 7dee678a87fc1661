// CUDA kernels for the op families with no GEMM: elementwise (add, mul, the activations and their
// gradients), bias_add and bias_grad, the shape ops (reshape, copy, fill, select_step and its
// gradient), softmax_cross_entropy and its gradient, and the sgd/adam updates. Each matches the
// CPU reference in ops/ and calls the same QUIVER_HD per-element math. Reductions are fixed-order
// tree sums in shared memory, never float atomics, so a result repeats run to run.
// Errors the CPU kernels throw for (a label outside 0..C-1, an Adam step below 1) cannot reach the
// host from a queued kernel without a synchronization: the affected values become NaN instead, so
// the loss and the parameters show the fault.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/elementwise.h"
#include "ops/optimizer.h"
#include "ops/softmax_cross_entropy.h"

namespace quiver::cuda {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Sum {
  __device__ double operator()(double a, double b) const { return a + b; }
};
// As std::max(a, b): the CPU kernels' comparison.
struct Max {
  __device__ float operator()(float a, float b) const { return a < b ? b : a; }
};

// Combines one value per thread of the block (blockDim.x a power of two, at most
// kThreadsPerBlock) in a fixed tree order; every thread gets the result. `shared` holds
// blockDim.x values and may be reused by the next call.
template <typename T, typename Op>
__device__ T block_reduce(T value, T* shared, Op op) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + half]);
    __syncthreads();
  }
  T result = shared[0];
  __syncthreads();
  return result;
}

// Threads of a block reducing `count` items: a power of two from one warp to kThreadsPerBlock.
unsigned reduction_threads(int64_t count) {
  unsigned threads = 32;
  while (threads < kThreadsPerBlock && threads < count) threads *= 2;
  return threads;
}

// ---- elementwise -------------------------------------------------------------------------------

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

// ---- bias --------------------------------------------------------------------------------------

// x viewed as (outer, channels, inner), as in ops/bias.cpp.
struct BiasGeometry {
  int64_t outer = 0, channels = 0, inner = 0;
};

BiasGeometry bias_geometry(const Shape& x) {
  BiasGeometry g;
  g.outer = x[0];
  g.channels = x[1];
  g.inner = x.numel() / std::max<int64_t>(1, g.outer * g.channels);
  return g;
}

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

// ---- shape ops ---------------------------------------------------------------------------------

// reshape and copy: any dtype, bytes as they are; nothing to do when the plan made them alias.
void copy_kernel(const KernelCall& call) {
  const StreamContext& stream = stream_of(call);
  const Tensor& dst = call.outputs[0];
  const Tensor& src = call.inputs[0];
  if (dst.raw() == src.raw() || dst.bytes() == 0) return;
  QUIVER_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), static_cast<size_t>(dst.bytes()),
                                    cudaMemcpyDeviceToDevice, stream.stream()));
}

__global__ void fill_kernel(float* dst, float value, int64_t count) {
  for (int64_t i = first_index(); i < count; i += grid_stride()) dst[i] = value;
}

KernelFn prepare_fill(const KernelSpec& spec) {
  float value = static_cast<float>(spec.node.attrs.get_float("value"));
  return [value](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    int64_t count = call.outputs[0].numel();
    fill_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream.stream()>>>(call.outputs[0].f32(),
                                                                             value, count);
    QUIVER_CUDA_CHECK_LAUNCH();
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

// ---- softmax cross-entropy ---------------------------------------------------------------------

// One block per row: the row's max, its shifted exps and their sum (double), the probabilities,
// and the row's loss, which the mean kernel then averages.
__global__ void softmax_cross_entropy_rows_kernel(float* probs, double* row_loss,
                                                  const float* logits, const int32_t* labels,
                                                  int64_t classes) {
  __shared__ float shared_max[kThreadsPerBlock];
  __shared__ double shared_sum[kThreadsPerBlock];
  const int64_t b = blockIdx.x;
  const float* row = logits + b * classes;  // (C)
  float* p = probs + b * classes;           // (C)
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) max_logit = Max{}(max_logit, row[c]);
  max_logit = block_reduce(max_logit, shared_max, Max{});
  double sum = 0.0;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    p[c] = math::softmax_shifted_exp(row[c], max_logit);
    sum += p[c];
  }
  sum = block_reduce(sum, shared_sum, Sum{});
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) p[c] = math::softmax_normalize(p[c], sum);
  if (threadIdx.x == 0) {
    int32_t label = labels[b];
    row_loss[b] = label < 0 || label >= classes
                      ? std::numeric_limits<double>::quiet_NaN()
                      : math::softmax_cross_entropy_row(sum, max_logit, row[label]);
  }
}

// loss = the mean of the row losses, summed by one block in a fixed order.
__global__ void mean_kernel(float* loss, const double* row_loss, int64_t batch) {
  __shared__ double shared[kThreadsPerBlock];
  double sum = 0.0;
  for (int64_t b = threadIdx.x; b < batch; b += blockDim.x) sum += row_loss[b];
  sum = block_reduce(sum, shared, Sum{});
  if (threadIdx.x == 0) loss[0] = static_cast<float>(sum / static_cast<double>(batch));
}

KernelFn prepare_softmax_cross_entropy(const KernelSpec& spec) {
  int64_t batch = spec.input(0).shape[0], classes = spec.input(0).shape[1];
  return [batch, classes](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    auto* row_loss = static_cast<double*>(stream.workspace(sizeof(double) * std::max<int64_t>(1, batch)));
    if (batch > 0) {
      softmax_cross_entropy_rows_kernel<<<static_cast<unsigned>(batch), reduction_threads(classes), 0,
                                          stream.stream()>>>(call.outputs[1].f32(),  // (B, C)
                                                             row_loss,               // (B)
                                                             call.inputs[0].f32(),   // (B, C)
                                                             call.inputs[1].i32(),   // (B)
                                                             classes);
      QUIVER_CUDA_CHECK_LAUNCH();
    }
    mean_kernel<<<1, reduction_threads(batch), 0, stream.stream()>>>(call.outputs[0].f32(),  // ()
                                                                     row_loss, batch);
    QUIVER_CUDA_CHECK_LAUNCH();
  };
}

__global__ void softmax_cross_entropy_grad_kernel(float* dlogits, const float* dloss,
                                                  const float* probs, const int32_t* labels,
                                                  int64_t count, int64_t batch, int64_t classes) {
  const float scale = dloss[0] / static_cast<float>(batch);
  for (int64_t i = first_index(); i < count; i += grid_stride()) {
    int64_t b = i / classes, c = i - b * classes;
    int32_t label = labels[b];
    dlogits[i] = label < 0 || label >= classes
                     ? kNaN
                     : math::softmax_cross_entropy_grad(probs[i], c == label, scale);
  }
}

KernelFn prepare_softmax_cross_entropy_grad(const KernelSpec& spec) {
  int64_t batch = spec.input(1).shape[0], classes = spec.input(1).shape[1];
  return [batch, classes](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    int64_t count = batch * classes;
    if (count == 0) return;
    softmax_cross_entropy_grad_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream.stream()>>>(
        call.outputs[0].f32(),  // (B, C)
        call.inputs[0].f32(),   // ()
        call.inputs[1].f32(),   // (B, C)
        call.inputs[2].i32(),   // (B)
        count, batch, classes);
    QUIVER_CUDA_CHECK_LAUNCH();
  };
}

// ---- optimizer updates -------------------------------------------------------------------------

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
  for (int64_t i = first_index(); i < count; i += grid_stride()) {
    if (t < 1.0f)
      w[i] = kNaN;  // the CPU kernel throws: "step must be >= 1"
    else
      math::adam_step(w[i], m[i], v[i], g[i], rate, beta1, beta2, epsilon, weight_decay, t);
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
  const Attrs& a = spec.node.attrs;
  float beta1 = static_cast<float>(a.get_float("beta1")), beta2 = static_cast<float>(a.get_float("beta2"));
  float epsilon = static_cast<float>(a.get_float("epsilon"));
  float weight_decay = static_cast<float>(a.get_float("weight_decay", 0.0));
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

// ---- registration ------------------------------------------------------------------------------

const bool registered = [] {
  OpRegistry& registry = OpRegistry::global();
  registry.add_kernel("add", cuda_kernel("cuda", binary<Add>()));
  registry.add_kernel("mul", cuda_kernel("cuda", binary<Mul>()));
  registry.add_kernel("relu", cuda_kernel("cuda", unary<Relu>()));
  registry.add_kernel("sigmoid", cuda_kernel("cuda", unary<Sigmoid>()));
  registry.add_kernel("tanh", cuda_kernel("cuda", unary<Tanh>()));
  registry.add_kernel("relu_grad", cuda_kernel("cuda", binary<ReluGrad>()));
  registry.add_kernel("sigmoid_grad", cuda_kernel("cuda", binary<SigmoidGrad>()));
  registry.add_kernel("tanh_grad", cuda_kernel("cuda", binary<TanhGrad>()));

  registry.add_kernel("bias_add", cuda_kernel("cuda", prepare_bias_add));
  registry.add_kernel("bias_grad", cuda_kernel("cuda", prepare_bias_grad));

  registry.add_kernel("reshape", cuda_kernel("cuda", KernelFn(copy_kernel)));
  registry.add_kernel("copy", cuda_kernel("cuda", KernelFn(copy_kernel)));
  registry.add_kernel("fill", cuda_kernel("cuda", prepare_fill));
  registry.add_kernel("select_step", cuda_kernel("cuda", prepare_select_step));
  registry.add_kernel("select_step_grad", cuda_kernel("cuda", prepare_select_step_grad));

  registry.add_kernel("softmax_cross_entropy", cuda_kernel("cuda", prepare_softmax_cross_entropy));
  registry.add_kernel("softmax_cross_entropy_grad",
                      cuda_kernel("cuda", prepare_softmax_cross_entropy_grad));

  registry.add_kernel("sgd_update", cuda_kernel("cuda", prepare_sgd));
  registry.add_kernel("adam_update", cuda_kernel("cuda", prepare_adam));
  return true;
}();

}  // namespace

}  // namespace quiver::cuda
