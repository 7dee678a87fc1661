// The CUDA DeviceBackend (core/device.h): device discovery, a caching allocator, synchronous and
// stream-ordered copies, stream ordering by events, and the SMA kernel. Registered at load time.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/multi_gpu.h"
#include "runtime/sma_math.h"

namespace quiver::cuda {

namespace {

// Blocks are rounded up so that buffers of nearby sizes share a free list.
int64_t rounded_size(int64_t bytes) {
  constexpr int64_t kSmall = 1 << 20;
  if (bytes <= kSmall) return std::max<int64_t>(512, (bytes + 511) / 512 * 512);
  return (bytes + kSmall - 1) / kSmall * kSmall;
}

// Per device: free blocks by size. A released block may still be read by work queued on some
// stream, so it first waits in `released`; the next allocation that finds no free block drains
// the device once (setup time, not the steady state, where plans allocate nothing) and reuses it.
class CachingAllocator {
 public:
  void* allocate(int device, int64_t bytes) {
    const int64_t size = rounded_size(bytes);
    std::lock_guard lock(mutex_);
    Pool& pool = pools_[device];
    if (void* block = take(pool, size)) return block;
    use_device(device);
    if (!pool.released.empty()) {
      QUIVER_CUDA_CHECK(cudaDeviceSynchronize());
      for (auto& [block_size, block] : pool.released) pool.free.emplace(block_size, block);
      pool.released.clear();
      if (void* block = take(pool, size)) return block;
    }
    void* block = nullptr;
    cudaError_t status = cudaMalloc(&block, static_cast<size_t>(size));
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it, give the cache back, try once more
      cudaError_t free_error = cudaSuccess;  // a failed free is said, not dropped (the first one)
      for (auto& [block_size, cached] : pool.free)
        if (cudaError_t freed = cudaFree(cached); freed != cudaSuccess && free_error == cudaSuccess) free_error = freed;
      pool.free.clear();
      QUIVER_CUDA_CHECK(free_error);
      status = cudaMalloc(&block, static_cast<size_t>(size));
    }
    if (status != cudaSuccess)
      throw Error(cat("CUDA: cannot allocate ", bytes, " bytes on cuda:", device, ": ",
                      cudaGetErrorName(status), ": ", cudaGetErrorString(status)));
    pool.in_use += size;
    return block;
  }

  void release(int device, void* block, int64_t bytes) {
    std::lock_guard lock(mutex_);
    Pool& pool = pools_[device];
    pool.in_use -= rounded_size(bytes);
    pool.released.emplace_back(rounded_size(bytes), block);
  }

  // Bytes handed out and not released.
  int64_t allocated_bytes(int device) {
    std::lock_guard lock(mutex_);
    return pools_[device].in_use;
  }

  // Frees every cached block of `device` once the device's queued work is done.
  void release_cached(int device) {
    std::lock_guard lock(mutex_);
    Pool& pool = pools_[device];
    if (pool.free.empty() && pool.released.empty()) return;
    use_device(device);
    QUIVER_CUDA_CHECK(cudaDeviceSynchronize());
    // Out of the lists before anything is freed: a failing cudaFree must not leave a freed block
    // listed for allocate() to hand out again. The first failure is reported after the rest.
    std::vector<std::pair<int64_t, void*>> blocks(pool.free.begin(), pool.free.end());
    blocks.insert(blocks.end(), pool.released.begin(), pool.released.end());
    pool.free.clear();
    pool.released.clear();
    cudaError_t first_error = cudaSuccess;
    for (auto& [size, block] : blocks)
      if (cudaError_t status = cudaFree(block); status != cudaSuccess && first_error == cudaSuccess) first_error = status;
    QUIVER_CUDA_CHECK(first_error);
  }

  // Bytes held for reuse (free or waiting) on `device`.
  int64_t cached_bytes(int device) {
    std::lock_guard lock(mutex_);
    int64_t bytes = 0;
    for (auto& [size, block] : pools_[device].free) bytes += size;
    for (auto& [size, block] : pools_[device].released) bytes += size;
    return bytes;
  }

 private:
  struct Pool {
    std::multimap<int64_t, void*> free;
    std::vector<std::pair<int64_t, void*>> released;
    int64_t in_use = 0;  // bytes handed out, not released
  };
  static void* take(Pool& pool, int64_t size) {
    auto found = pool.free.find(size);
    if (found == pool.free.end()) return nullptr;
    void* block = found->second;
    pool.free.erase(found);
    pool.in_use += size;
    return block;
  }
  std::mutex mutex_;
  std::map<int, Pool> pools_;
};

struct SmaBuffers {
  float* params[kMaxLearnersPerDevice];
  const float* snapshots[kMaxLearnersPerDevice];
};

__global__ void sma_round_kernel(float* z, float* previous_move, SmaBuffers buffers, int learners,
                                 float alpha, float mu_z, int64_t count) {
  for (int64_t i = first_index(); i < count;
       i += grid_stride()) {
    const float zi = z[i];
    float corrections = 0.0f;
    for (int j = 0; j < learners; ++j)
      corrections += math::sma_correct(buffers.params[j][i], buffers.snapshots[j][i], zi, alpha);
    float updated = zi;
    math::sma_move(updated, previous_move[i], corrections, mu_z);
    z[i] = updated;
  }
}

// A captured, instantiated CUDA graph and the workspace it was captured with.
struct CapturedGraph {
  cudaGraphExec_t exec = nullptr;
  int device = 0;
  int64_t workspace_generation = 0;
};

const StreamContext& as_stream(const ExecContext& ctx) {
  const auto* stream = dynamic_cast<const StreamContext*>(&ctx);
  if (!stream) throw Error("CUDA: an operation on a CUDA device was given a context that is not a CUDA stream");
  return *stream;
}

class CudaBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "CUDA"; }

  int device_count() const override {
    std::call_once(counted_, [this] {
      int count = 0;
      // No driver or no device: the backend exists but has nothing to run on, and says why (a
      // driver older than the runtime reads as "no such device" otherwise).
      if (const cudaError_t status = cudaGetDeviceCount(&count); status != cudaSuccess) {
        cudaGetLastError();
        count = 0;
        no_devices_ = cat(cudaGetErrorName(status), ": ", cudaGetErrorString(status));
      }
      count_ = count;
    });
    return count_;
  }

  std::string why_no_devices() const override {
    device_count();
    return no_devices_;
  }

  // What the driver has free plus what the allocator holds for reuse on this device.
  int64_t free_memory(int device) const override {
    use_device(device);
    size_t free = 0, total = 0;
    QUIVER_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return static_cast<int64_t>(free) + allocator_.cached_bytes(device);
  }

  void* allocate(int device, int64_t bytes) override { return allocator_.allocate(device, bytes); }
  void release(int device, void* pointer, int64_t bytes) override { allocator_.release(device, pointer, bytes); }
  int64_t allocated_bytes(int device) const override { return allocator_.allocated_bytes(device); }
  void release_cached(int device) override { allocator_.release_cached(device); }

  // Synchronous in the full sense: the legacy default stream does not wait for the non-blocking
  // streams, so the devices involved are drained before (queued work may still read or write
  // these buffers) and after (the copy has landed when this returns). Setup and tests only.
  void copy(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes) override {
    drain(dst_device);
    drain(src_device);
    use_device(dst_device.is_cpu() ? src_device.index : dst_device.index);
    QUIVER_CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault));
    drain(dst_device);
    drain(src_device);
  }

  void fill(void* dst, int device, float value, int64_t count) override {
    drain(Device::cuda(device));
    launch_fill(static_cast<float*>(dst), value, count, nullptr);
    QUIVER_CUDA_CHECK(cudaDeviceSynchronize());
  }

  std::unique_ptr<ExecContext> make_stream(int device) override {
    return std::make_unique<StreamContext>(device, [this, device] { allocator_.release_cached(device); });
  }

  void upload(const ExecContext& ctx, void* dst, const void* src, int64_t bytes) override {
    const StreamContext& stream = as_stream(ctx);
    use_device(stream.device());
    StreamContext::Staging& staging = stream.next_staging(bytes);
    std::memcpy(staging.host, src, static_cast<size_t>(bytes));
    QUIVER_CUDA_CHECK(cudaMemcpyAsync(dst, staging.host, static_cast<size_t>(bytes),
                                      cudaMemcpyHostToDevice, stream.stream()));
    QUIVER_CUDA_CHECK(cudaEventRecord(staging.copied, stream.stream()));
  }

  void download(const ExecContext& ctx, void* dst, const void* src, int64_t bytes) override {
    const StreamContext& stream = as_stream(ctx);
    use_device(stream.device());
    StreamContext::Staging& staging = stream.next_staging(bytes);
    QUIVER_CUDA_CHECK(cudaMemcpyAsync(staging.host, src, static_cast<size_t>(bytes),
                                      cudaMemcpyDeviceToHost, stream.stream()));
    QUIVER_CUDA_CHECK(cudaEventRecord(staging.copied, stream.stream()));
    QUIVER_CUDA_CHECK(cudaEventSynchronize(staging.copied));
    std::memcpy(dst, staging.host, static_cast<size_t>(bytes));
  }

  void copy_async(const ExecContext& ctx, void* dst, const void* src, int64_t bytes) override {
    const StreamContext& stream = as_stream(ctx);
    use_device(stream.device());
    QUIVER_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                                      stream.stream()));
  }

  std::shared_ptr<void> capture(const ExecContext& ctx, const std::function<void()>& body,
                                std::string& why) override {
    const StreamContext& stream = as_stream(ctx);
    use_device(stream.device());
    // Thread-local: other learners' threads may allocate or synchronise meanwhile.
    QUIVER_CUDA_CHECK(cudaStreamBeginCapture(stream.stream(), cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      body();
    } catch (...) {
      cudaStreamEndCapture(stream.stream(), &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();  // the capture's error is not the caller's
      throw;
    }
    cudaError_t status = cudaStreamEndCapture(stream.stream(), &graph);
    cudaGraphExec_t exec = nullptr;
    if (status == cudaSuccess) status = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (status != cudaSuccess) {
      cudaGetLastError();
      why = cat(cudaGetErrorName(status), ": ", cudaGetErrorString(status));
      return nullptr;
    }
    auto* captured = new CapturedGraph{exec, stream.device(), stream.workspace_generation()};
    return std::shared_ptr<void>(captured, [](CapturedGraph* g) {
      // A deleter must not throw (it runs in destructors): a device that cannot be selected any
      // more (a sticky fault) leaves the exec to be freed on whichever device is current.
      try {
        use_device(g->device);
      } catch (...) {
      }
      cudaGraphExecDestroy(g->exec);
      delete g;
    });
  }

  bool replay(const ExecContext& ctx, const void* handle) override {
    const StreamContext& stream = as_stream(ctx);
    const auto* captured = static_cast<const CapturedGraph*>(handle);
    if (captured->workspace_generation != stream.workspace_generation()) return false;
    use_device(stream.device());
    QUIVER_CUDA_CHECK(cudaGraphLaunch(captured->exec, stream.stream()));
    return true;
  }

  void synchronize(const ExecContext& ctx) override {
    const StreamContext& stream = as_stream(ctx);
    use_device(stream.device());
    QUIVER_CUDA_CHECK(cudaStreamSynchronize(stream.stream()));
  }

  void order(const ExecContext& earlier, const ExecContext& later) override {
    const StreamContext& from = as_stream(earlier);
    const StreamContext& to = as_stream(later);
    use_device(from.device());
    QUIVER_CUDA_CHECK(cudaEventRecord(from.order_event(), from.stream()));
    use_device(to.device());
    QUIVER_CUDA_CHECK(cudaStreamWaitEvent(to.stream(), from.order_event(), 0));
  }

  void sma_round(const ExecContext& ctx, float* z, float* previous_move, float* const* params,
                 const float* const* snapshots, int learners, float alpha, float mu_z,
                 int64_t count) override {
    if (learners < 1 || learners > kMaxLearnersPerDevice)
      throw Error(cat("SMA on CUDA: supports 1 to ", kMaxLearnersPerDevice, " learners per device, got ", learners));
    const StreamContext& stream = as_stream(ctx);
    use_device(stream.device());
    SmaBuffers buffers{};
    for (int j = 0; j < learners; ++j) {
      buffers.params[j] = params[j];
      buffers.snapshots[j] = snapshots[j];
    }
    sma_round_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream.stream()>>>(
        z, previous_move, buffers, learners, alpha, mu_z, count);
    QUIVER_CUDA_CHECK_LAUNCH();
  }

  std::shared_ptr<void> make_communicators(const std::vector<int>& devices) override {
    return cuda::make_communicators(devices);
  }

  void sma_round_devices(std::span<const SmaShard> shards, float alpha, float mu_z, int64_t count,
                         const void* communicators) override {
    cuda::sma_round_devices(shards, alpha, mu_z, count, communicators);
  }

 private:
  static void drain(Device device) {
    if (device.is_cpu()) return;
    use_device(device.index);
    QUIVER_CUDA_CHECK(cudaDeviceSynchronize());
  }
  mutable std::once_flag counted_;
  mutable int count_ = 0;
  mutable std::string no_devices_;
  mutable CachingAllocator allocator_;
};

// Never destroyed: tensors released during static destruction still find it.
const bool backend_registered = [] {
  register_device_backend(DeviceKind::CUDA, new CudaBackend());
  return true;
}();

}  // namespace

}  // namespace quiver::cuda
