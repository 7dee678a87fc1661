// lstm: one fused LSTM layer. x (B, T, I), wx (I, 4H), wh (H, 4H), b (4H) -> h (B, T, H) and a
// cache (T, B, 5H) of the gate activations i, f, g, o and the cell state c, kept for lstm_grad.
// The input projection of all T steps is one GEMM; only h(t-1) * wh is sequential. Backward is
// one node (lstm_grad) doing backpropagation through time, then three large GEMMs for dx, dwx
// and dwh. The per-element cell math is written once here for the CPU and CUDA kernels; the CPU
// kernels apply it a row at a time through ops/lstm_cell.cpp, the one file built with -ffast-math.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "ops/host_device.h"

namespace quiver::math {

struct LstmCell {
  float i, f, g, o, c, h;
};

// NaN, told by its bits: in the cell loops, built with -ffast-math (finite math only), GCC folds
// `x != x` and std::isnan to false.
QUIVER_HD static inline bool is_nan_bits(float x) {
#ifdef __CUDA_ARCH__
  const uint32_t bits = __float_as_uint(x);
#else
  const uint32_t bits = std::bit_cast<uint32_t>(x);
#endif
  return (bits & 0x7fffffffu) > 0x7f800000u;
}

// A gate's sigmoid. The clamp keeps exp() finite: in the cell loop, built with -ffast-math, GCC
// divides through a reciprocal estimate whose Newton step turns 1 / (1 + inf) into NaN, not 0
// (a pre-activation below -88.7). exp(80) is 5.5e34: the gate is then 1.8e-35, not 0. A NaN
// passes, so a diverged layer shows in its output: in the vectorized loop the clamp is a max,
// which would make a NaN pre-activation a gate of 1.8e-35 (the check costs ~1% of the loop).
QUIVER_HD static inline float lstm_gate(float pre) {
  const float gate = 1.0f / (1.0f + std::exp(-(pre < -80.0f ? -80.0f : pre)));
  return is_nan_bits(pre) ? pre : gate;
}

// Pre-activations of the four gates and the previous cell state -> the new cell.
QUIVER_HD static inline LstmCell lstm_cell_forward(float pre_i, float pre_f, float pre_g, float pre_o,
                                                   float c_prev) {
  LstmCell cell;
  cell.i = lstm_gate(pre_i);
  cell.f = lstm_gate(pre_f);
  cell.g = std::tanh(pre_g);
  cell.o = lstm_gate(pre_o);
  cell.c = cell.f * c_prev + cell.i * cell.g;
  cell.h = cell.o * std::tanh(cell.c);
  return cell;
}

struct LstmCellGrad {
  float d_pre_i, d_pre_f, d_pre_g, d_pre_o, dc_prev;
};

// dh and dc arriving at step t (dc from step t+1) -> gradients of the pre-activations and c(t-1).
QUIVER_HD static inline LstmCellGrad lstm_cell_backward(float i, float f, float g, float o, float c,
                                                        float c_prev, float dh, float dc_next) {
  float tanh_c = std::tanh(c);
  float dc = dc_next + dh * o * (1.0f - tanh_c * tanh_c);
  LstmCellGrad grad;
  grad.d_pre_i = dc * g * i * (1.0f - i);
  grad.d_pre_f = dc * c_prev * f * (1.0f - f);
  grad.d_pre_g = dc * i * (1.0f - g * g);
  grad.d_pre_o = dh * tanh_c * o * (1.0f - o);
  grad.dc_prev = dc * f;
  return grad;
}

}  // namespace quiver::math

namespace quiver {

// The cell over one batch row of `hidden` units, in ops/lstm_cell.cpp: the exp/tanh loops dominate
// the LSTM's time, and -ffast-math lets GCC vectorize them with glibc's libmvec. Only that file is
// built so, and it includes nothing but this header: no inline function of the rest of Quiver gets
// a fast-math copy (the linker keeps one copy of each, whichever it meets first), so NaN checks
// elsewhere stay exact. This header's own cell functions above are static for the same reason:
// each file keeps its own copy, so where a call is not inlined (a debug build) the reference
// kernels in ops/lstm.cpp never run the fast-math copy, nor the cell loop the strict one.
// cell (5H): i, f, g, o, c; h (H); pre (4H): gate pre-activations; c_prev (H).
void lstm_cell_row_forward(float* cell, float* h, const float* pre, const float* c_prev, int64_t hidden);
// d_pre (4H): gradients of the pre-activations; dc (H): dc arriving from step t+1 in, dc(t-1) out;
// cell (5H) and c_prev (H) as the forward left them; dh_step, dh_carry (H): dh from above and from
// step t+1.
void lstm_cell_row_backward(float* d_pre, float* dc, const float* cell, const float* c_prev, const float* dh_step,
                            const float* dh_carry, int64_t hidden);

}  // namespace quiver
