// SMA across GPUs (DeviceBackend::sma_round_devices): per-device sums of corrections, all-reduced
// with NCCL, the same move applied on every device. The NCCL communicators are the caller's
// (make_communicators: one set per group of learners, destroyed with it), not kept process-wide.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "core/device.h"

namespace quiver::cuda {

// One NCCL communicator per device of `devices` (at least two, distinct), destroyed with the
// returned handle.
std::shared_ptr<void> make_communicators(const std::vector<int>& devices);
void sma_round_devices(std::span<const SmaShard> shards, float alpha, float mu_z, int64_t count,
                       const void* communicators);

}  // namespace quiver::cuda
