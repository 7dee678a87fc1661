// Synchronous model averaging (SMA, Crossbow, DESIGN.md section 3 "Learners and SMA") over flat
// parameter buffers. Each learner j has taken a local step from its snapshot s_j (its parameters
// before the step) to w_j; after the round:
//   c_j = alpha * (s_j - z);  w_j = w_j - c_j;  d = sum_j c_j + mu_z * d_prev;  d_prev = d;  z = z + d
// z, the central average model, is what is evaluated and checkpointed. One pass over the buffers.
// With a staleness bound (LearnerOptions::staleness) there is no common round end: each learner,
// right after its own step, absorbs its correction into z against z as the other learners have
// left it (absorb()): c_j = alpha*(s_j - z); w_j -= c_j; z += c_j. z's momentum rides on learner
// 0's turns: the corrections absorbed since its last turn plus mu_z times the move before are
// the last round's move d, and z += mu_z*d. In lockstep that is the rule above with the momentum
// one turn later; for one learner it is the rule above exactly.
#pragma once

#include <array>
#include <mutex>
#include <span>

#include "core/op.h"
#include "core/tensor.h"

namespace quiver {

// Which part of a round's pass one call makes: share `index` of `count` equal runs of the blocks.
// CPU learners that meet after their steps each take one share on their own threads
// (LearnerGroup::round), instead of waking a pool for the pass.
struct SmaShare {
  int index = 0, count = 1;
};

struct SmaOptions {
  double alpha = -1.0;  // correction weight in [0, 1]; negative: 1/k for k learners
  double mu_z = 0.9;   // momentum of the average model's movement
};

// `options` with alpha resolved (negative: 1/learners) and checked; throws quiver::Error naming
// the bad value.
SmaOptions checked_sma_options(SmaOptions options, int learners);

class SmaSync {
 public:
  // `average` is the buffer z lives in (initialised by the caller, usually to the replicas'
  // common starting point); it is updated in place. alpha must be in [0, 1] (or negative for 1/k), mu_z in [0, 1).
  // `absorbing`: keep what z absorbed since learner 0's last turn, for absorb().
  SmaSync(Tensor average, int learners, SmaOptions options, bool absorbing = false);

  // One synchronisation after a round: `params[j]` (w_j, corrected in place) and `snapshots[j]`
  // (s_j), each a flat buffer shaped like the average.
  // Blocks of the buffers are processed in parallel through `ctx`; on the CPU a call may make one
  // `share` of the pass (calls for disjoint shares may run at once). Buffers on a device (all on
  // the average's) are updated by the device's kernel queued on `ctx`, a stream of that device.
  void round(std::span<const Tensor> params, std::span<const Tensor> snapshots, const ExecContext& ctx,
             SmaShare share = {});
  void round(std::span<const Tensor> params, std::span<const Tensor> snapshots) {
    round(params, snapshots, SerialContext());
  }
  // The same round after a momentum-SGD step (w_j = s_j + v_j): the snapshots are recovered as
  // s_j = w_j - v_j from the velocities, so no snapshot copy is made before the step. CPU only.
  void round_after_sgd(std::span<const Tensor> params, std::span<const Tensor> velocities, const ExecContext& ctx,
                       SmaShare share = {});
  // Bounded staleness: one learner's correction against the current z, applied to its replica
  // `w` and to z at once. The snapshot is `other` (or w - other when `from_velocity`: `other`
  // is the momentum-SGD velocity). Learners may absorb concurrently: each block of z is updated
  // under its own lock; learner j starts at block j/k of the way through, so learners that absorb
  // at once rarely wait for each other. CPU only; the SmaSync must have been made `absorbing`.
  void absorb(int learner, const Tensor& w, const Tensor& other, bool from_velocity, const ExecContext& ctx);
  // Every replica becomes z (after a learning-rate drop); the average's momentum is cleared.
  void reset_replicas(std::span<const Tensor> params);
  // After the group is rebuilt (another learner count): z goes on moving as `before`'s did, with
  // its last move (and, absorbing, what it took since learner 0's last turn), not from rest.
  // `before` must be idle and over the same parameters.
  void continue_from(const SmaSync& before);

  const Tensor& average() const { return average_; }
  double alpha() const { return alpha_; }
  double mu_z() const { return mu_z_; }

 private:
  template <bool kFromVelocity>
  void cpu_round(float* z, float* previous, std::span<const Tensor> params, std::span<const Tensor> other, float alpha,
                 float mu_z, int64_t n, const ExecContext& ctx, SmaShare share);
  template <bool kFromVelocity>
  void cpu_absorb(int learner, float* w, const float* other, int64_t n, const ExecContext& ctx);
  Tensor average_, previous_move_;
  Tensor absorbed_;  // absorbing: the corrections z took since learner 0's last turn
  std::array<std::mutex, 64> block_locks_;  // absorb(): block b of z under block_locks_[b % 64]
  int learners_;
  double alpha_, mu_z_;
};

}  // namespace quiver
