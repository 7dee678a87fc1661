// Fixed-order reductions inside one thread block, shared by the CUDA kernels that sum or take a
// maximum (bias_grad, softmax_cross_entropy): a tree in shared memory, never float atomics, so a
// result repeats run to run. Device code: included by .cu files only.
#pragma once

#include <cstdint>

#include "cuda/context.h"

namespace quiver::cuda {

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
inline unsigned reduction_threads(int64_t count) {
  unsigned threads = 32;
  while (threads < kThreadsPerBlock && threads < count) threads *= 2;
  return threads;
}

}  // namespace quiver::cuda
