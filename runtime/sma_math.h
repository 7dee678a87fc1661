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

// Bounded staleness: learner j's correction moves z at once and is added to `absorbed`, what z has
// absorbed since learner 0's last turn.
QUIVER_HD inline void sma_absorb(float& w, float s, float& z, float& absorbed, float alpha) {
  const float correction = sma_correct(w, s, z, alpha);
  z += correction;
  absorbed += correction;
}

// Learner 0's turn also carries z's momentum: the last round's move d = absorbed + mu_z*d_prev,
// then z += c_0 + mu_z*d. In lockstep this is the synchronous rule, d applied one turn later.
QUIVER_HD inline void sma_absorb_leading(float& w, float s, float& z, float& absorbed, float& previous_move,
                                         float alpha, float mu_z) {
  const float last_move = absorbed + mu_z * previous_move;
  previous_move = last_move;
  const float correction = sma_correct(w, s, z, alpha);
  absorbed = correction;
  z += correction + mu_z * last_move;
}

}  // namespace quiver::math
