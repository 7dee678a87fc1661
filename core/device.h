// DeviceBackend: what core and runtime need of a non-CPU device (today CUDA). cuda/ implements it
// and registers it at load time; core and runtime reach the device only through this interface,
// so no CPU file includes a CUDA header and a build without the toolkit has no backend at all.
// A "stream" is an ExecContext the backend made: kernels of that device find their stream,
// library handles and workspace in it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/shape.h"

namespace quiver {

class ExecContext;

// The most learners one device's SMA round takes (its kernels receive the replicas' pointers by
// value); LearnerGroup refuses more per device before building anything.
constexpr int kMaxLearnersPerDevice = 32;

// One device's part of an SMA round over several devices: its copy of z and of the previous
// move, and the learners (replica, snapshot) that live on it; all queued on `stream`.
struct SmaShard {
  const ExecContext* stream = nullptr;
  float* z = nullptr;
  float* previous_move = nullptr;
  std::vector<float*> params;
  std::vector<const float*> snapshots;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual const char* name() const = 0;
  // Devices present; 0 when there is none or no driver (the backend is still usable for nothing).
  virtual int device_count() const = 0;
  // Where device_count() found none because the driver said no (none installed, older than the
  // runtime): what it said. Empty otherwise.
  virtual std::string why_no_devices() const { return {}; }
  // Free bytes on `device` now.
  virtual int64_t free_memory(int device) const = 0;

  // Device memory through a caching allocator: release keeps the block for reuse.
  virtual void* allocate(int device, int64_t bytes) = 0;
  virtual void release(int device, void* pointer, int64_t bytes) = 0;
  // Bytes handed out by allocate() and not released yet: what live tensors hold on `device`.
  virtual int64_t allocated_bytes(int device) const = 0;
  // Gives the blocks cached for reuse on `device` back to the driver, once its queued work is done.
  virtual void release_cached(int device) = 0;
  // Synchronous copies (host<->device, device<->device) and fills, for setup and tests.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes) = 0;
  virtual void fill(void* dst, int device, float value, int64_t count) = 0;  // 32-bit words

  // A new non-blocking stream on `device` with its own library handles and workspace.
  virtual std::unique_ptr<ExecContext> make_stream(int device) = 0;
  // Host -> device on `stream`, staged through pinned memory; returns once the host buffer may be
  // reused (the copy itself continues on the stream).
  virtual void upload(const ExecContext& stream, void* dst, const void* src, int64_t bytes) = 0;
  // Device -> host after the work queued on `stream` so far; returns when the bytes are there.
  virtual void download(const ExecContext& stream, void* dst, const void* src, int64_t bytes) = 0;
  // Device -> device on `stream`, after the work queued there so far.
  virtual void copy_async(const ExecContext& stream, void* dst, const void* src, int64_t bytes) = 0;
  // CUDA graphs: records the work `body` queues on `stream` without running it, and returns a
  // handle that replay() queues as one launch. Null, with the reason in `why`, when the work
  // cannot be captured (the stream is then as before and nothing ran); an exception from `body`
  // ends the capture and propagates.
  virtual std::shared_ptr<void> capture(const ExecContext& stream, const std::function<void()>& body,
                                        std::string& why) = 0;
  // Queues a captured graph on `stream`. False, queuing nothing, when the graph is stale: the
  // stream's workspace has moved since it was captured.
  virtual bool replay(const ExecContext& stream, const void* graph) = 0;
  // Blocks until the work queued on `stream` is done; rethrows its error.
  virtual void synchronize(const ExecContext& stream) = 0;
  // Work queued on `later` from now on waits (on the device, through an event) for the work
  // queued on `earlier` so far. The host does not block.
  virtual void order(const ExecContext& earlier, const ExecContext& later) = 0;

  // One SMA round (runtime/sma.h) over k flat buffers of `count` floats on one device, queued
  // on `stream`: w[j] -= alpha*(s[j] - z); d = sum_j alpha*(s[j] - z) + mu_z*d_prev; z += d.
  virtual void sma_round(const ExecContext& stream, float* z, float* previous_move,
                         float* const* params, const float* const* snapshots, int learners,
                         float alpha, float mu_z, int64_t count) = 0;
  // Communicators for all-reducing across `devices` (NCCL), in that order: owned by the caller
  // (made once per group of learners, destroyed with it after its streams drain), so two groups on
  // the same devices never share a handle. (Their rounds' launches still take turns, process-wide:
  // NCCL needs collectives of different communicators queued in one order on every device.)
  virtual std::shared_ptr<void> make_communicators(const std::vector<int>& devices) = 0;
  // The same round with learners spread over devices, one shard per device (distinct devices):
  // each device sums its learners' corrections, the sums are all-reduced across devices through
  // `communicators` (from make_communicators() for the shards' devices in order; may be null for
  // one shard), and every device applies the same move to its copy of z, so the copies stay equal.
  virtual void sma_round_devices(std::span<const SmaShard> shards, float alpha, float mu_z, int64_t count,
                                 const void* communicators) = 0;
};

// Called by a backend's library at load time.
void register_device_backend(DeviceKind kind, DeviceBackend* backend);
// The backend of `kind`, or nullptr when this build has none.
DeviceBackend* device_backend(DeviceKind kind);
// The backend of `device`, checked: throws quiver::Error when the build has no such backend or
// the device index does not exist.
DeviceBackend& backend_for(Device device);

}  // namespace quiver
