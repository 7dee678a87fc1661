#include "runtime/device_sma.h"

#include "core/error.h"

namespace quiver {

DeviceSma::DeviceSma(Tensor average, std::vector<Device> devices, int learners, SmaOptions options) {
  const SmaOptions checked = checked_sma_options(options, learners);
  alpha_ = static_cast<float>(checked.alpha);
  mu_z_ = static_cast<float>(checked.mu_z);
  if (devices.empty() || devices.front() != average.device())
    throw Error(cat("SMA: the average model is on ", average.device().str(), ", not on the first learner device"));
  for (const Device& device : devices) {
    if (device.is_cpu()) throw Error("SMA on devices: the CPU is not a device here (use SmaSync)");
    Shard shard;
    shard.device = device;
    shard.stream = backend_for(device).make_stream(device.index);
    if (device == average.device()) {
      shard.z = average;
    } else {
      shard.z = Tensor::empty(average.shape(), DType::F32, device);
      shard.z.copy_from(average);
    }
    shard.previous_move = Tensor::zeros(average.shape(), DType::F32, device);
    shards_.push_back(std::move(shard));
  }
  if (shards_.size() > 1) {
    std::vector<int> indices;
    for (const Shard& shard : shards_) indices.push_back(shard.device.index);
    communicators_ = backend_for(shards_.front().device).make_communicators(indices);
  }
}

DeviceSma::~DeviceSma() {
  // The communicators go first (members in reverse order): nothing may still be queued on them,
  // on any device, also where another device's stream failed.
  for (const Shard& shard : shards_) {
    try {
      backend_for(shard.device).synchronize(*shard.stream);
    } catch (...) {  // a destructor has nowhere to report to; the round's own error was thrown before
    }
  }
}

size_t DeviceSma::shard_of(const Tensor& buffer) const {
  for (size_t d = 0; d < shards_.size(); ++d)
    if (shards_[d].device == buffer.device()) return d;
  throw Error(cat("SMA: a learner's buffer is on ", buffer.device().str(), ", which holds no copy of the average"));
}

void DeviceSma::round(std::span<const ExecContext* const> streams, std::span<const Tensor> params,
                      std::span<const Tensor> snapshots) {
  if (params.size() != streams.size() || snapshots.size() != streams.size())
    throw Error(cat("SMA: ", streams.size(), " streams, ", params.size(), " replicas and ", snapshots.size(),
                    " snapshots"));
  const int64_t n = average().numel();
  std::vector<SmaShard> round_shards(shards_.size());
  for (size_t d = 0; d < shards_.size(); ++d) {
    round_shards[d].stream = shards_[d].stream.get();
    round_shards[d].z = shards_[d].z.f32();
    round_shards[d].previous_move = shards_[d].previous_move.f32();
  }
  DeviceBackend& backend = backend_for(shards_.front().device);
  for (size_t j = 0; j < params.size(); ++j) {
    if (params[j].numel() != n || snapshots[j].numel() != n || snapshots[j].device() != params[j].device())
      throw Error(cat("SMA: learner ", j, "'s replica and snapshot do not match the average (", n, " values on ",
                      average().device().str(), ")"));
    const size_t d = shard_of(params[j]);
    backend.order(*streams[j], *shards_[d].stream);
    round_shards[d].params.push_back(params[j].f32());
    round_shards[d].snapshots.push_back(snapshots[j].f32());
  }
  std::vector<SmaShard> used;
  for (SmaShard& shard : round_shards)
    if (!shard.params.empty()) used.push_back(std::move(shard));
  if (used.size() != shards_.size())
    throw Error(cat("SMA: every device needs at least one learner; ", used.size(), " of ", shards_.size(), " have one"));
  // The learners' next work waits for the round, also when it fails part way: the corrections
  // already queued still write the replicas.
  auto order_learners = [&] {
    for (size_t j = 0; j < params.size(); ++j) backend.order(*shards_[shard_of(params[j])].stream, *streams[j]);
  };
  try {
    backend.sma_round_devices(used, alpha_, mu_z_, n, communicators_.get());
  } catch (...) {
    try {
      order_learners();
    } catch (...) {  // the round's own error is the one to report
    }
    throw;
  }
  order_learners();
}

void DeviceSma::reset_replicas(std::span<const Tensor> params) {
  drain();
  for (Shard& shard : shards_) {
    if (shard.z.storage() != average().storage()) shard.z.copy_from(average());
    shard.previous_move.fill(0.0f);
  }
  for (const Tensor& w : params) {
    if (w.numel() != average().numel()) throw Error("SMA: a replica's size differs from the average's");
    w.copy_from(average());
  }
}

void DeviceSma::continue_from(const DeviceSma& before) {
  if (before.shards_.size() != shards_.size() || before.average().numel() != average().numel())
    throw Error(cat("SMA: cannot continue from an average of ", before.average().numel(), " parameters on ",
                    before.shards_.size(), " device(s); this one has ", average().numel(), " on ", shards_.size()));
  before.drain();
  drain();
  for (size_t d = 0; d < shards_.size(); ++d) {
    if (before.shards_[d].device != shards_[d].device)
      throw Error(cat("SMA: cannot continue from an average on ", before.shards_[d].device.str(), " on ",
                      shards_[d].device.str()));
    shards_[d].previous_move.copy_from(before.shards_[d].previous_move);
    // The first device's z is the average itself; the others' copies were taken when this one
    // was built, before a resize's fold moved z.
    if (shards_[d].z.storage() != average().storage()) shards_[d].z.copy_from(before.shards_[d].z);
  }
}

void DeviceSma::order_before(const ExecContext& reader) const {
  backend_for(shards_.front().device).order(*shards_.front().stream, reader);
}

void DeviceSma::drain() const {
  for (const Shard& shard : shards_) backend_for(shard.device).synchronize(*shard.stream);
}

}  // namespace quiver
