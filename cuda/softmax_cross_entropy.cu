// CUDA kernels of softmax_cross_entropy and its gradient (ops/softmax_cross_entropy.h): one block
// a row for the max, the shifted exps and their sum (double), then one block averages the rows'
// losses, all in a fixed order (cuda/block_reduce.cuh). A label outside 0..C-1, which the CPU
// kernel throws for, cannot reach the host from a queued kernel without a synchronization: that
// row's loss and gradient become NaN instead, so the loss shows the fault.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "cuda/block_reduce.cuh"
#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/softmax_cross_entropy.h"

namespace quiver::cuda {

namespace {

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
  const int64_t row_loss_bytes = static_cast<int64_t>(sizeof(double)) * std::max<int64_t>(1, batch);
  spec.workspace_bytes = row_loss_bytes;
  return [batch, classes, row_loss_bytes](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    auto* row_loss = static_cast<double*>(stream.workspace(row_loss_bytes));
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

const bool softmax_cross_entropy_kernels_registered = [] {
  OpRegistry& registry = OpRegistry::global();
  registry.add_kernel("softmax_cross_entropy", cuda_kernel("cuda", prepare_softmax_cross_entropy));
  registry.add_kernel("softmax_cross_entropy_grad", cuda_kernel("cuda", prepare_softmax_cross_entropy_grad));
  return true;
}();

}  // namespace

}  // namespace quiver::cuda
