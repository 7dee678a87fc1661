// The CUDA side of an execution context: a non-blocking stream on one device with its own cuBLAS
// and cuDNN handles (bound to the stream) and a growing scratch workspace. A learner owns one;
// every CUDA kernel finds it in KernelCall::ctx and queues its work there, never on the legacy
// default stream. Host-side parallel_for (rare: geometry, checks) runs inline on the caller.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "core/op.h"

namespace quiver::cuda {

class StreamContext final : public ExecContext {
 public:
  // `release_cached` gives the device's caching-allocator blocks back to the driver. The memory
  // check counts those blocks as free (DeviceBackend::free_memory), but what this stream
  // allocates for itself (its library handles, its workspace) comes from the driver directly:
  // when that runs out of memory the cache is given back and the allocation tried once more.
  StreamContext(int device, std::function<void()> release_cached);
  ~StreamContext() override;
  StreamContext(const StreamContext&) = delete;
  StreamContext& operator=(const StreamContext&) = delete;

  int threads() const override { return 1; }
  void parallel_for(int64_t count, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& body) const override {
    if (count > 0) body(0, count);
  }

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  // Scratch of at least `bytes` on this stream's device, reused by every kernel of the stream
  // (work on one stream is ordered, so one buffer suffices). Valid until the next call.
  void* workspace(int64_t bytes) const;
  int64_t workspace_size() const override { return workspace_bytes_; }
  // What the stream and its cuBLAS and cuDNN handles hold on the device (measured once per device).
  int64_t resident_bytes() const override { return resident_bytes_; }
  // Counts the workspace's moves: a CUDA graph captured with one workspace is stale after a move.
  int64_t workspace_generation() const { return workspace_generation_; }
  // Pinned host memory for staging copies: a ring of buffers used in turn, each with an event
  // marking the end of the copy that last used it. A training step stages its batch, labels and
  // scalars and fetches its loss, fewer copies than the ring holds, so a step's copies never wait
  // for one another: only for the previous step's, long done.
  struct Staging {
    void* host = nullptr;
    int64_t bytes = 0;
    cudaEvent_t copied = nullptr;
  };
  Staging& next_staging(int64_t bytes) const;
  // Recorded by DeviceBackend::order on this stream.
  cudaEvent_t order_event() const { return order_event_; }

 private:
  static constexpr int kStagingRing = 8;
  mutable Staging staging_[kStagingRing];
  mutable int next_staging_ = 0;
  cudaEvent_t order_event_ = nullptr;
  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  int64_t resident_bytes_ = 0;
  std::function<void()> release_cached_;
  mutable void* workspace_ = nullptr;
  mutable int64_t workspace_bytes_ = 0;
  mutable int64_t workspace_generation_ = 0;
};

// The stream of a kernel call, with its device made current on this thread so launches go there;
// throws quiver::Error naming the node when the call did not come with a CUDA stream (a CUDA
// kernel chosen for a CPU plan).
const StreamContext& stream_of(const KernelCall& call);

// Makes `device` current on this thread (cheap when it already is).
void use_device(int device);

// A CUDA kernel with no per-Plan state, for registering in the one registry.
KernelImpl cuda_kernel(std::string name, KernelFn fn);
KernelImpl cuda_kernel(std::string name, std::function<KernelFn(const KernelSpec&)> prepare);

// Launch geometry for `count` independent elements: 256 threads a block, grid-stride loops.
inline unsigned blocks_for(int64_t count) {
  int64_t blocks = (count + 255) / 256;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  return static_cast<unsigned>(blocks);
}
constexpr unsigned kThreadsPerBlock = 256;

// What a queued kernel writes where the CPU kernel would throw (it cannot reach the host).
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Queues `count` floats at `dst` set to `value` on `stream` (nullptr: the legacy default stream)
// and checks the launch.
void launch_fill(float* dst, float value, int64_t count, cudaStream_t stream);

#ifdef __CUDACC__
// Grid-stride loops: for (int64_t i = first_index(); i < count; i += grid_stride()).
__device__ inline int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }
#endif

}  // namespace quiver::cuda
