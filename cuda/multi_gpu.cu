#include "cuda/multi_gpu.h"

#include <nccl.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "runtime/sma_math.h"

#define QUIVER_NCCL_CHECK(call)                                                                   \
  do {                                                                                            \
    ncclResult_t quiver_status_ = (call);                                                         \
    if (quiver_status_ != ncclSuccess)                                                            \
      ::quiver::cuda::fail(#call, __FILE__, __LINE__, ::quiver::cuda::nccl_status_name(quiver_status_), \
                           ::quiver::cuda::nccl_status_detail(quiver_status_));                   \
  } while (0)

namespace quiver::cuda {

namespace {

// NCCL has a description for each status but no name: the name, as the other libraries give theirs.
const char* nccl_status_name(ncclResult_t status) {
  switch (status) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult_t (unknown)";
  }
}

// The status's description and, where NCCL kept one (2.13 on), what went wrong in this thread's
// last call.
std::string nccl_status_detail(ncclResult_t status) {
  std::string detail = ncclGetErrorString(status);
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  if (const char* last = ncclGetLastError(nullptr); last && *last) detail += cat(" (", last, ")");
#endif
  return detail;
}

struct LearnerBuffers {
  float* params[kMaxLearnersPerDevice];
  const float* snapshots[kMaxLearnersPerDevice];
};

// move = sum_j alpha*(s_j - z), each replica corrected in place.
__global__ void corrections_kernel(float* move, const float* z, LearnerBuffers buffers, int learners, float alpha,
                                   int64_t count) {
  for (int64_t i = first_index(); i < count; i += grid_stride()) {
    float sum = 0.0f;
    for (int j = 0; j < learners; ++j) sum += math::sma_correct(buffers.params[j][i], buffers.snapshots[j][i], z[i], alpha);
    move[i] = sum;
  }
}

__global__ void move_kernel(float* z, float* previous_move, const float* move, float mu_z, int64_t count) {
  for (int64_t i = first_index(); i < count; i += grid_stride())
    math::sma_move(z[i], previous_move[i], move[i], mu_z);
}

// A set of communicators, one per device, in the order they were made for; destroyed with it
// (after the owner's streams drained: DeviceSma's destructor).
struct Communicators {
  std::vector<int> devices;
  // A collective of the set failed: the others already queued would wait for their peer for
  // ever, and with them every stream ordered after them. The set is aborted (its queued work
  // ends), and each later round refuses it with the error that broke it. (Mutable: a round holds
  // the set as const.)
  mutable std::vector<ncclComm_t> comms;
  mutable std::string broken;
  Communicators() = default;
  Communicators(const Communicators&) = delete;
  Communicators& operator=(const Communicators&) = delete;
  void abort(const std::string& why) const {
    if (broken.empty()) broken = why;
    for (ncclComm_t comm : comms)
      if (comm) ncclCommAbort(comm);  // its error is the one already being reported
    comms.assign(comms.size(), nullptr);
  }
  ~Communicators() {
    for (ncclComm_t comm : comms)
      if (comm) ncclCommDestroy(comm);  // nothing to report to from a destructor
  }
};

}  // namespace

std::shared_ptr<void> make_communicators(const std::vector<int>& devices) {
  if (devices.size() < 2) throw Error(cat("NCCL communicators: need at least two devices, got ", devices.size()));
  for (size_t d = 0; d < devices.size(); ++d)
    for (size_t e = 0; e < d; ++e)
      if (devices[d] == devices[e]) throw Error(cat("NCCL communicators: cuda:", devices[d], " is listed twice"));
  auto set = std::make_shared<Communicators>();
  set->devices = devices;
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  QUIVER_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()));
  set->comms = std::move(comms);
  return set;
}

void sma_round_devices(std::span<const SmaShard> shards, float alpha, float mu_z, int64_t count,
                       const void* communicators) {
  std::vector<int> devices;
  std::vector<const StreamContext*> streams;
  for (const SmaShard& shard : shards) {
    const auto* stream = dynamic_cast<const StreamContext*>(shard.stream);
    if (!stream) throw Error("SMA across GPUs: a shard's stream is not a CUDA stream");
    if (shard.params.size() != shard.snapshots.size() || shard.params.empty() ||
        shard.params.size() > static_cast<size_t>(kMaxLearnersPerDevice))
      throw Error(cat("SMA across GPUs: cuda:", stream->device(), " has ", shard.params.size(), " replicas and ",
                      shard.snapshots.size(), " snapshots (1 to ", kMaxLearnersPerDevice, " per device)"));
    for (int seen : devices)
      if (seen == stream->device()) throw Error(cat("SMA across GPUs: two shards on cuda:", seen));
    devices.push_back(stream->device());
    streams.push_back(stream);
  }
  // Checked before any replica moves toward z: a round that cannot all-reduce corrects nothing.
  const auto* set = static_cast<const Communicators*>(communicators);
  if (shards.size() > 1) {
    if (!set || set->devices != devices)
      throw Error("SMA across GPUs: no NCCL communicators for these devices (DeviceBackend::make_communicators, "
                  "made for the shards' devices in order)");
    if (!set->broken.empty())
      throw Error(cat("SMA across GPUs: the NCCL communicators were aborted after an earlier failure: ", set->broken));
  }
  // Per device: the corrections' sum, in the stream's workspace (ordered work on one stream).
  // Every workspace first, then the corrections: a workspace that cannot grow must fail the round
  // before any device's replicas have moved toward z.
  std::vector<float*> moves;
  for (size_t d = 0; d < shards.size(); ++d) {
    use_device(devices[d]);
    moves.push_back(static_cast<float*>(streams[d]->workspace(count * static_cast<int64_t>(sizeof(float)))));
  }
  for (size_t d = 0; d < shards.size(); ++d) {
    use_device(devices[d]);
    float* move = moves[d];
    LearnerBuffers buffers{};
    for (size_t j = 0; j < shards[d].params.size(); ++j) {
      buffers.params[j] = shards[d].params[j];
      buffers.snapshots[j] = shards[d].snapshots[j];
    }
    corrections_kernel<<<blocks_for(count), kThreadsPerBlock, 0, streams[d]->stream()>>>(
        move, shards[d].z, buffers, static_cast<int>(shards[d].params.size()), alpha, count);
    QUIVER_CUDA_CHECK_LAUNCH();
  }
  if (shards.size() > 1) {
    const std::vector<ncclComm_t>& comms = set->comms;
    // Groups on the same GPUs from two threads: NCCL needs collectives of different communicators
    // queued in the same order on every device, or their kernels may wait on each other for ever.
    // One launch at a time keeps that order (the launch only queues; the device work overlaps).
    static std::mutex launch_order;
    const std::lock_guard launching(launch_order);
    try {
      QUIVER_NCCL_CHECK(ncclGroupStart());
      // A failed call inside the group must still close it, or every later NCCL call on this
      // thread would be deferred forever.
      struct GroupEnd {
        bool armed = true;
        ~GroupEnd() {
          if (armed) ncclGroupEnd();
        }
      } group_end;
      for (size_t d = 0; d < shards.size(); ++d)
        QUIVER_NCCL_CHECK(ncclAllReduce(moves[d], moves[d], static_cast<size_t>(count), ncclFloat, ncclSum, comms[d],
                                        streams[d]->stream()));
      group_end.armed = false;
      QUIVER_NCCL_CHECK(ncclGroupEnd());
    } catch (const std::exception& error) {
      // Some devices' all-reduces may be queued without their peers': abort them, so that the
      // sync streams (and the learners ordered after them) do not wait for ever.
      set->abort(error.what());
      throw;
    }
  }
  for (size_t d = 0; d < shards.size(); ++d) {
    use_device(devices[d]);
    move_kernel<<<blocks_for(count), kThreadsPerBlock, 0, streams[d]->stream()>>>(shards[d].z, shards[d].previous_move,
                                                                                  moves[d], mu_z, count);
    QUIVER_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace quiver::cuda
