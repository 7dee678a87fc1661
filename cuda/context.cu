#include "cuda/context.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <mutex>

#include "core/error.h"
#include "cuda/check.h"

namespace quiver::cuda {

void fail(const char* call, const char* file, int line, const std::string& name,
          const std::string& description) {
  // A kernel's fault is reported by whichever later call next asks the device: the op being run
  // then is not necessarily the one that faulted.
  static constexpr const char* kSticky[] = {"cudaErrorIllegalAddress", "cudaErrorLaunchFailure",
                                            "cudaErrorMisalignedAddress", "cudaErrorIllegalInstruction",
                                            "cudaErrorAssert", "cudaErrorHardwareStackError", "cudaErrorInvalidPc"};
  const bool sticky = std::find(std::begin(kSticky), std::end(kSticky), name) != std::end(kSticky);
  throw Error(cat("CUDA: ", call, " failed: ", name, ": ", description, " (", file, ":", line, ")",
                  sticky ? "; a fault of earlier device work, not necessarily of this call: run with "
                           "CUDA_LAUNCH_BLOCKING=1 (and quiver-train --cuda-graphs off) to find the op"
                         : ""));
}

void use_device(int device) {
  int current = -1;
  QUIVER_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) QUIVER_CUDA_CHECK(cudaSetDevice(device));
}

namespace {

// The device memory one stream's library handles hold on `device`, measured once per device as
// the free memory a stream with its own cuBLAS and cuDNN handles takes. The handles allocate for
// themselves and no API says how much (an H100 with CUDA 13: 64.25 MiB cuBLAS, 7.75 MiB cuDNN,
// 0.5 MiB the stream). Two such streams are made and the second one measured: the first may still
// pay the libraries' one-time costs. cuBLAS keeps its own pool even when given a workspace
// (cublasSetWorkspace), so none is given. Not cached when it cannot be measured (96 MiB is
// assumed then, and the next stream tries again). Memory another thread or process takes between the two readings counts
// too: the check then plans on more, never on less.
struct ProbeStream {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;
  bool make() {
    return cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess &&
           cublas_api().create(&cublas) == CUBLAS_STATUS_SUCCESS &&
           cublas_api().set_stream(cublas, stream) == CUBLAS_STATUS_SUCCESS &&
           cudnnCreate(&cudnn) == CUDNN_STATUS_SUCCESS && cudnnSetStream(cudnn, stream) == CUDNN_STATUS_SUCCESS;
  }
  ~ProbeStream() {
    if (cudnn) cudnnDestroy(cudnn);
    if (cublas) cublas_api().destroy(cublas);
    if (stream) cudaStreamDestroy(stream);
  }
};

// What a stream's handles are taken to hold where they could not be measured: more than the
// 66-74 MiB measured on an H100 and an H200. A probe fails when memory is short, exactly where a
// memory check must not plan on nothing.
constexpr int64_t kUnmeasuredHandleBytes = int64_t{96} << 20;

int64_t handle_bytes(int device) {
  static std::mutex mutex;
  static std::map<int, int64_t> measured;
  std::lock_guard lock(mutex);
  if (auto known = measured.find(device); known != measured.end()) return known->second;
  size_t before = 0, after = 0, total = 0;
  bool made = false;
  {
    ProbeStream first, second;
    made = first.make() && cudaMemGetInfo(&before, &total) == cudaSuccess && second.make() &&
           cudaMemGetInfo(&after, &total) == cudaSuccess;
  }
  if (!made) {
    cudaGetLastError();  // a failed probe leaves no error for the next CUDA call to find
    return kUnmeasuredHandleBytes;  // measured again next time
  }
  if (before <= after) return kUnmeasuredHandleBytes;  // memory freed meanwhile (another process): measure again later
  return measured[device] = static_cast<int64_t>(before - after);
}

bool out_of_memory(cudaError_t status) { return status == cudaErrorMemoryAllocation; }
bool out_of_memory(cublasStatus_t status) { return status == CUBLAS_STATUS_ALLOC_FAILED; }
bool out_of_memory(cudnnStatus_t status) { return status == CUDNN_STATUS_ALLOC_FAILED; }

// Runs `allocate` (a CUDA, cuBLAS or cuDNN call that takes device memory from the driver) and,
// when it ran out of memory, gives the caching allocator's blocks back and runs it once more.
template <typename Allocate>
auto with_cache_given_back(const std::function<void()>& release_cached, Allocate allocate) {
  auto status = allocate();
  if (out_of_memory(status) && release_cached) {
    cudaGetLastError();  // clear it: the retry's result is the one to report
    release_cached();
    status = allocate();
  }
  return status;
}

}  // namespace

StreamContext::StreamContext(int device, std::function<void()> release_cached)
    : device_(device), release_cached_(std::move(release_cached)) {
  use_device(device);
  QUIVER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  try {
    QUIVER_CUBLAS_CHECK(with_cache_given_back(release_cached_, [&] { return cublas_api().create(&cublas_); }));
    QUIVER_CUBLAS_CHECK(cublas_api().set_stream(cublas_, stream_));
    QUIVER_CUDNN_CHECK(with_cache_given_back(release_cached_, [&] { return cudnnCreate(&cudnn_); }));
    QUIVER_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    resident_bytes_ = handle_bytes(device);
    QUIVER_CUDA_CHECK(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming));
    for (Staging& staging : staging_)
      QUIVER_CUDA_CHECK(cudaEventCreateWithFlags(&staging.copied, cudaEventDisableTiming));
  } catch (...) {
    for (Staging& staging : staging_)
      if (staging.copied) cudaEventDestroy(staging.copied);
    if (order_event_) cudaEventDestroy(order_event_);
    if (cudnn_) cudnnDestroy(cudnn_);
    if (cublas_) cublas_api().destroy(cublas_);
    cudaStreamDestroy(stream_);
    throw;
  }
}

// Destructors report nothing: the stream is drained first so no queued kernel outlives the
// memory it uses.
StreamContext::~StreamContext() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  if (workspace_) cudaFree(workspace_);
  for (Staging& staging : staging_) {
    if (staging.host) cudaFreeHost(staging.host);
    if (staging.copied) cudaEventDestroy(staging.copied);
  }
  if (order_event_) cudaEventDestroy(order_event_);
  if (cudnn_) cudnnDestroy(cudnn_);
  if (cublas_) cublas_api().destroy(cublas_);
  cudaStreamDestroy(stream_);
}

void* StreamContext::workspace(int64_t bytes) const {
  if (bytes <= workspace_bytes_) return workspace_;
  use_device(device_);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  QUIVER_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
  if (capturing != cudaStreamCaptureStatusNone)  // a graph cannot record a reallocation
    throw Error(cat("CUDA: the stream's workspace would grow to ", bytes, " bytes while capturing a graph"));
  ++workspace_generation_;
  // Work already queued may still read the old buffer: free it only after the stream drains.
  if (workspace_) {
    QUIVER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    QUIVER_CUDA_CHECK(cudaFree(workspace_));
    workspace_ = nullptr;
    workspace_bytes_ = 0;
  }
  QUIVER_CUDA_CHECK(with_cache_given_back(release_cached_,
                                          [&] { return cudaMalloc(&workspace_, static_cast<size_t>(bytes)); }));
  workspace_bytes_ = bytes;
  return workspace_;
}

StreamContext::Staging& StreamContext::next_staging(int64_t bytes) const {
  Staging& staging = staging_[next_staging_];
  next_staging_ = (next_staging_ + 1) % kStagingRing;
  // The copy that last read this buffer must be done before the host writes it again.
  QUIVER_CUDA_CHECK(cudaEventSynchronize(staging.copied));
  if (staging.bytes < bytes) {
    // The whole ring grows at once, so a step's largest copy (its batch) sizes every buffer in the
    // first step, wherever it falls in the ring: a step makes fewer copies than the ring holds and
    // not a divisor of them, so growing one buffer at a time would reallocate over the first
    // steps, into those that capture CUDA graphs (cudaMallocHost and cudaFreeHost may synchronise).
    for (Staging& buffer : staging_) {
      if (buffer.bytes >= bytes) continue;
      QUIVER_CUDA_CHECK(cudaEventSynchronize(buffer.copied));  // uploads are asynchronous
      if (buffer.host) QUIVER_CUDA_CHECK(cudaFreeHost(buffer.host));
      buffer.host = nullptr;
      buffer.bytes = 0;
      QUIVER_CUDA_CHECK(cudaMallocHost(&buffer.host, static_cast<size_t>(bytes)));
      buffer.bytes = bytes;
    }
  }
  return staging;
}

const StreamContext& stream_of(const KernelCall& call) {
  const auto* stream = dynamic_cast<const StreamContext*>(&call.ctx);
  if (!stream)
    throw Error(cat(call.node.op, " '", call.node.name,
                    "': a CUDA kernel was called without a CUDA stream (the plan is not on a CUDA device)"));
  use_device(stream->device());
  return *stream;
}

namespace {

__global__ void fill_kernel(float* dst, float value, int64_t count) {
  for (int64_t i = first_index(); i < count; i += grid_stride()) dst[i] = value;
}

}  // namespace

void launch_fill(float* dst, float value, int64_t count, cudaStream_t stream) {
  fill_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream>>>(dst, value, count);
  QUIVER_CUDA_CHECK_LAUNCH();
}

KernelImpl cuda_kernel(std::string name, KernelFn fn) {
  return cuda_kernel(std::move(name), [fn = std::move(fn)](const KernelSpec&) { return fn; });
}

KernelImpl cuda_kernel(std::string name, std::function<KernelFn(const KernelSpec&)> prepare) {
  KernelImpl impl;
  impl.name = std::move(name);
  impl.device = DeviceKind::CUDA;
  impl.prepare = std::move(prepare);
  return impl;
}

}  // namespace quiver::cuda
