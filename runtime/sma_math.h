// The per-element math of SMA (runtime/sma.h), written once for the CPU loop and the CUDA kernel.
#pragma once

#include "ops/kernel_util.h"

namespace quiver::math {

// Learner j's correction toward z: c = alpha*(s - z); the replica moves back by it. Returns c.
QUIVER_HD inline float sma_correct(float& w, float s, float z, float alpha) {
  const float correction = alpha * (s - z);
  w -= correction;
  return correction;
}

// The average model's move: d = sum_j c_j + mu_z*d_prev; d_prev = d; z = z + d.
QUIVER_HD inline void sma_move(float& z, float& previous_move, float corrections, float mu_z) {
  const float d = corrections + mu_z * previous_move;
  previous_move = d;
  z += d;
}

}  // namespace quiver::math
