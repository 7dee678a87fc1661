// Synchronous model averaging (SMA, Crossbow, DESIGN.md section 3 "Learners and SMA") over flat
// parameter buffers. Each learner j has taken a local step from its snapshot s_j (its parameters
// before the step) to w_j; after the round:
//   c_j = alpha * (s_j - z);  w_j = w_j - c_j;  d = sum_j c_j + mu_z * d_prev;  d_prev = d;  z = z + d
// z, the central average model, is what is evaluated and checkpointed. One pass over the buffers.
#pragma once

#include <span>

#include "core/op.h"
#include "core/tensor.h"

namespace quiver {

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
  SmaSync(Tensor average, int learners, SmaOptions options);

  // One synchronisation after a round: `params[j]` (w_j, corrected in place) and `snapshots[j]`
  // (s_j), each a flat buffer shaped like the average.
  // Blocks of the buffers are processed in parallel through `ctx`. Buffers on a device (all on
  // the average's) are updated by the device's kernel queued on `ctx`, a stream of that device.
  void round(std::span<const Tensor> params, std::span<const Tensor> snapshots, const ExecContext& ctx);
  void round(std::span<const Tensor> params, std::span<const Tensor> snapshots) {
    round(params, snapshots, SerialContext());
  }
  // The same round after a momentum-SGD step (w_j = s_j + v_j): the snapshots are recovered as
  // s_j = w_j - v_j from the velocities, so no snapshot copy is made before the step. CPU only.
  void round_after_sgd(std::span<const Tensor> params, std::span<const Tensor> velocities, const ExecContext& ctx);
  // Every replica becomes z (after a learning-rate drop); the average's momentum is cleared.
  void reset_replicas(std::span<const Tensor> params);

  const Tensor& average() const { return average_; }
  double alpha() const { return alpha_; }
  double mu_z() const { return mu_z_; }

 private:
  template <bool kFromVelocity>
  void cpu_round(float* z, float* previous, std::span<const Tensor> params, std::span<const Tensor> other, float alpha,
                 float mu_z, int64_t n, const ExecContext& ctx);
  Tensor average_, previous_move_;
  int learners_;
  double alpha_, mu_z_;
};

}  // namespace quiver
