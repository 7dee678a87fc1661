#include "runtime/sma.h"

#include <algorithm>

#include "core/error.h"

namespace quiver {

SmaSync::SmaSync(Tensor average, int learners, SmaOptions options)
    : average_(std::move(average)), learners_(learners), alpha_(options.alpha), mu_z_(options.mu_z) {
  if (learners < 1) throw Error(cat("SMA: needs at least one learner, got ", learners));
  if (options.alpha < 0.0) alpha_ = 1.0 / learners;
  if (!(alpha_ >= 0.0 && alpha_ <= 1.0)) throw Error(cat("SMA: alpha must be in [0, 1], got ", options.alpha));
  if (!(mu_z_ >= 0.0 && mu_z_ < 1.0)) throw Error(cat("SMA: mu_z must be in [0, 1), got ", options.mu_z));
  if (average_.dtype() != DType::F32) throw Error("SMA: the average model must be float32");
  previous_move_ = Tensor::zeros(average_.shape(), DType::F32);
}

void SmaSync::round(std::span<const Tensor> params, std::span<const Tensor> snapshots, const ExecContext& ctx) {
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
  constexpr int64_t kBlock = 4096;  // learners are visited block by block, so z stays in cache
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  ctx.parallel_for(blocks, 8, [&](int64_t first_block, int64_t last_block) {
  for (int64_t block = first_block; block < last_block; ++block) {
    const int64_t begin = block * kBlock, end = std::min(n, begin + kBlock);
    float move[kBlock] = {};
    for (size_t j = 0; j < params.size(); ++j) {
      float* w = params[j].f32();
      const float* s = snapshots[j].f32();
      for (int64_t i = begin; i < end; ++i) {
        const float correction = alpha * (s[i] - z[i]);
        w[i] -= correction;
        move[i - begin] += correction;
      }
    }
    for (int64_t i = begin; i < end; ++i) {
      const float d = move[i - begin] + mu_z * previous[i];
      previous[i] = d;
      z[i] += d;
    }
  }
  });
}

void SmaSync::reset_replicas(std::span<const Tensor> params) {
  for (const Tensor& w : params) {
    if (w.numel() != average_.numel()) throw Error("SMA: a replica's size differs from the average's");
    std::copy_n(average_.f32(), average_.numel(), w.f32());
  }
  std::fill_n(previous_move_.f32(), previous_move_.numel(), 0.0f);
}

}  // namespace quiver
