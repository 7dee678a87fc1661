#include "runtime/sma.h"

#include <algorithm>
#include <vector>

#include "core/denormals.h"
#include "core/device.h"
#include "core/error.h"
#include "core/float_range.h"
#include "runtime/sma_math.h"

namespace quiver {
namespace {
// SMA passes go block by block: a block of z stays in cache while every learner visits it, and is
// the unit absorb() locks.
constexpr int64_t kBlock = 4096;

// One learner's corrections over one block, added to `move`; restrict-qualified so it vectorizes
// (GCC left it scalar when w, z and move might alias).
template <bool kFromVelocity>
void correct_block(float* __restrict w, const float* __restrict other, const float* __restrict z,
                   float* __restrict move, float alpha, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float snapshot = kFromVelocity ? w[i] - other[i] : other[i];
    move[i] += math::sma_correct(w[i], snapshot, z[i], alpha);
  }
}

// One block of one learner's absorption; templated and restrict-qualified so the loop vectorizes
// (a branch on the learner inside it, or possible aliasing, made it scalar and ~2x slower).
template <bool kFromVelocity, bool kLeading>
void absorb_block(float* __restrict w, const float* __restrict other, float* __restrict z, float* __restrict absorbed,
                  float* __restrict previous, float alpha, float mu_z, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float snapshot = kFromVelocity ? w[i] - other[i] : other[i];
    if constexpr (kLeading)
      math::sma_absorb_leading(w[i], snapshot, z[i], absorbed[i], previous[i], alpha, mu_z);
    else
      math::sma_absorb(w[i], snapshot, z[i], absorbed[i], alpha);
  }
}
}  // namespace

SmaOptions checked_sma_options(SmaOptions options, int learners) {
  if (learners < 1) throw Error(cat("SMA: needs at least one learner, got ", learners));
  SmaOptions checked = options;
  if (options.alpha < 0.0) checked.alpha = 1.0 / learners;
  if (const std::string problem = float_fraction_problem(checked.alpha, true); !problem.empty())
    throw Error(cat("SMA: alpha ", problem));
  if (const std::string problem = float_fraction_problem(checked.mu_z, false); !problem.empty())
    throw Error(cat("SMA: mu_z ", problem));
  return checked;
}

SmaSync::SmaSync(Tensor average, int learners, SmaOptions options, bool absorbing)
    : average_(std::move(average)), learners_(learners) {
  const SmaOptions checked = checked_sma_options(options, learners);
  alpha_ = checked.alpha;
  mu_z_ = checked.mu_z;
  if (average_.dtype() != DType::F32) throw Error("SMA: the average model must be float32");
  previous_move_ = Tensor::zeros(average_.shape(), DType::F32, average_.device());
  if (absorbing) {
    if (!average_.device().is_cpu()) throw Error("SMA: absorbing corrections (a staleness bound) runs on the CPU only");
    absorbed_ = Tensor::zeros(average_.shape(), DType::F32);
  }
}

void SmaSync::round(std::span<const Tensor> params, std::span<const Tensor> snapshots, const ExecContext& ctx,
                    SmaShare share) {
  if (static_cast<int>(params.size()) != learners_ || snapshots.size() != params.size())
    throw Error(cat("SMA: expected ", learners_, " learners' parameters and snapshots, got ", params.size(), " and ",
                    snapshots.size()));
  const int64_t n = average_.numel();
  for (size_t j = 0; j < params.size(); ++j)
    if (params[j].numel() != n || snapshots[j].numel() != n)
      throw Error(cat("SMA: learner ", j, " has ", params[j].numel(), " parameters and a snapshot of ",
                      snapshots[j].numel(), "; the average has ", n));
  float* z = average_.f32();
  float* previous = previous_move_.f32();
  const float alpha = static_cast<float>(alpha_), mu_z = static_cast<float>(mu_z_);
  if (!average_.device().is_cpu()) {
    if (share.index != 0 || share.count != 1) throw Error("SMA: a round on a device runs whole, not in shares");
    std::vector<float*> w;
    std::vector<const float*> s;
    for (size_t j = 0; j < params.size(); ++j) {
      if (params[j].device() != average_.device() || snapshots[j].device() != average_.device())
        throw Error(cat("SMA: learner ", j, "'s buffers are not on ", average_.device().str(), " with the average"));
      w.push_back(params[j].f32());
      s.push_back(snapshots[j].f32());
    }
    backend_for(average_.device())
        .sma_round(ctx, z, previous, w.data(), s.data(), learners_, alpha, mu_z, n);
    return;
  }
  cpu_round<false>(z, previous, params, snapshots, alpha, mu_z, n, ctx, share);
}

void SmaSync::round_after_sgd(std::span<const Tensor> params, std::span<const Tensor> velocities,
                              const ExecContext& ctx, SmaShare share) {
  const int64_t n = average_.numel();
  if (static_cast<int>(params.size()) != learners_ || velocities.size() != params.size())
    throw Error(cat("SMA: expected ", learners_, " learners' parameters and velocities, got ", params.size(), " and ",
                    velocities.size()));
  if (!average_.device().is_cpu()) throw Error("SMA: round_after_sgd runs on the CPU only");
  for (size_t j = 0; j < params.size(); ++j)
    if (params[j].numel() != n || velocities[j].numel() != n)
      throw Error(cat("SMA: learner ", j, " has ", params[j].numel(), " parameters and ", velocities[j].numel(),
                      " velocities; the average has ", n));
  cpu_round<true>(average_.f32(), previous_move_.f32(), params, velocities, static_cast<float>(alpha_),
                  static_cast<float>(mu_z_), n, ctx, share);
}

// One pass over the buffers (or `share` of it), block by block so z stays in cache while every
// learner is visited. kFromVelocity: `other` holds v_j and the snapshot is w_j - v_j; else `other`
// holds s_j.
template <bool kFromVelocity>
void SmaSync::cpu_round(float* z, float* previous, std::span<const Tensor> params, std::span<const Tensor> other,
                        float alpha, float mu_z, int64_t n, const ExecContext& ctx, SmaShare share) {
  if (share.count < 1 || share.index < 0 || share.index >= share.count)
    throw Error(cat("SMA: share ", share.index, " of ", share.count, " does not exist"));
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const int64_t first = blocks * share.index / share.count, last = blocks * (share.index + 1) / share.count;
  ctx.parallel_for(last - first, 8, [&](int64_t first_in_share, int64_t last_in_share) {
    const FlushDenormals flushed;  // as the kernels (core/denormals.h)
    for (int64_t block = first + first_in_share; block < first + last_in_share; ++block) {
      const int64_t begin = block * kBlock, end = std::min(n, begin + kBlock);
      float move[kBlock] = {};
      for (size_t j = 0; j < params.size(); ++j)
        correct_block<kFromVelocity>(params[j].f32() + begin, other[j].f32() + begin, z + begin, move, alpha,
                                     end - begin);
      for (int64_t i = begin; i < end; ++i) math::sma_move(z[i], previous[i], move[i - begin], mu_z);
    }
  });
}

void SmaSync::absorb(int learner, const Tensor& w, const Tensor& other, bool from_velocity, const ExecContext& ctx) {
  const int64_t n = average_.numel();
  if (learner < 0 || learner >= learners_) throw Error(cat("SMA: no learner ", learner, " of ", learners_));
  if (!absorbed_.defined()) throw Error("SMA: absorb() needs an SmaSync made for absorbing (a staleness bound)");
  if (!w.device().is_cpu() || !other.device().is_cpu())  // z is: the constructor checked
    throw Error("SMA: absorbing one learner's correction (a staleness bound) runs on the CPU only");
  if (w.numel() != n || other.numel() != n)
    throw Error(cat("SMA: a learner has ", w.numel(), " parameters and ", other.numel(), " ",
                    from_velocity ? "velocities" : "snapshot values", "; the average has ", n));
  if (from_velocity)
    cpu_absorb<true>(learner, w.f32(), other.f32(), n, ctx);
  else
    cpu_absorb<false>(learner, w.f32(), other.f32(), n, ctx);
}

template <bool kFromVelocity>
void SmaSync::cpu_absorb(int learner, float* w, const float* other, int64_t n, const ExecContext& ctx) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const int64_t first = learner * blocks / learners_;
  float* z = average_.f32();
  float* absorbed = absorbed_.f32();
  float* previous = previous_move_.f32();
  const float alpha = static_cast<float>(alpha_), mu_z = static_cast<float>(mu_z_);
  ctx.parallel_for(blocks, 8, [&](int64_t first_block, int64_t last_block) {
    const FlushDenormals flushed;
    for (int64_t rotated = first_block; rotated < last_block; ++rotated) {
      const int64_t block = (rotated + first) % blocks;
      const int64_t begin = block * kBlock, end = std::min(n, begin + kBlock);
      std::lock_guard<std::mutex> lock(block_locks_[static_cast<size_t>(block) % block_locks_.size()]);
      if (learner == 0)
        absorb_block<kFromVelocity, true>(w + begin, other + begin, z + begin, absorbed + begin, previous + begin,
                                          alpha, mu_z, end - begin);
      else
        absorb_block<kFromVelocity, false>(w + begin, other + begin, z + begin, absorbed + begin, previous + begin,
                                           alpha, mu_z, end - begin);
    }
  });
}

void SmaSync::reset_replicas(std::span<const Tensor> params) {
  for (const Tensor& w : params) {
    if (w.numel() != average_.numel()) throw Error("SMA: a replica's size differs from the average's");
    w.copy_from(average_);
  }
  previous_move_.fill(0.0f);
  if (absorbed_.defined()) absorbed_.fill(0.0f);
}

void SmaSync::continue_from(const SmaSync& before) {
  if (before.previous_move_.numel() != previous_move_.numel() || before.average_.device() != average_.device())
    throw Error(cat("SMA: cannot continue from an average of ", before.previous_move_.numel(), " parameters on ",
                    before.average_.device().str(), "; this one has ", previous_move_.numel(), " on ",
                    average_.device().str()));
  previous_move_.copy_from(before.previous_move_);
  if (absorbed_.defined() && before.absorbed_.defined()) absorbed_.copy_from(before.absorbed_);
}

}  // namespace quiver
