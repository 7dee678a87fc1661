// SMA for learners on CUDA devices, one device or several (DESIGN.md section 3, "Learners and
// SMA"; issue 5). Each device holds a copy of z and of its last move and has a sync stream. A
// round: every learner's stream is ordered into its device's sync stream by an event; each device
// sums its learners' corrections; with several devices the sums are all-reduced (NCCL); every
// device applies the same move to its copy of z; each learner's stream then waits for its
// device's sync stream. The host queues all of it and never waits for a whole device.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "core/device.h"
#include "core/op.h"
#include "core/tensor.h"
#include "runtime/sma.h"

namespace quiver {

class DeviceSma {
 public:
  // `average` is z on the first of `devices` (initialised by the caller); copies are made on the
  // others. `learners` sets the default alpha (1/k).
  DeviceSma(Tensor average, std::vector<Device> devices, int learners, SmaOptions options);
  ~DeviceSma();

  // Learner j: the stream its step was queued on, its parameters (w_j, corrected in place) and
  // snapshot (s_j), both on one of the devices.
  void round(std::span<const ExecContext* const> streams, std::span<const Tensor> params,
             std::span<const Tensor> snapshots);
  // Every replica and every copy of z becomes z; the moves are cleared (after a drain).
  void reset_replicas(std::span<const Tensor> params);
  // After the group is rebuilt: z goes on moving with `before`'s last move (both drained, over
  // the same devices and parameters), and each device's copy of z is `before`'s, which a fold of
  // the local steps (LearnerGroup::fold_local_steps) may have moved since this one was made.
  void continue_from(const DeviceSma& before);
  // Work queued on `reader` (a stream of the first device) from now on sees the latest z.
  void order_before(const ExecContext& reader) const;
  // Blocks until every sync stream is idle.
  void drain() const;
  const Tensor& average() const { return shards_.front().z; }
  float alpha() const { return alpha_; }

 private:
  struct Shard {
    Device device;
    std::shared_ptr<ExecContext> stream;
    Tensor z, previous_move;
  };
  size_t shard_of(const Tensor& buffer) const;
  std::vector<Shard> shards_;
  // NCCL's communicators for the shards' devices (more than one device): this group's own, destroyed
  // before the shards' streams, after the destructor has drained them.
  std::shared_ptr<void> communicators_;
  float alpha_, mu_z_;
};

}  // namespace quiver
