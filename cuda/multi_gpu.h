// SMA across GPUs (DeviceBackend::sma_round_devices): per-device sums of corrections, all-reduced
// with NCCL, the same move applied on every device. NCCL communicators are made once per set of
// devices and kept.
#pragma once

#include <span>

#include "core/device.h"

namespace quiver::cuda {

void sma_round_devices(std::span<const SmaShard> shards, float alpha, float mu_z, int64_t count);

}  // namespace quiver::cuda
