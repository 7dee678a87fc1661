// The LSTM cell's per-row loops, the one file built with -ffast-math (CMakeLists.txt): see
// lstm_cell_row_forward in ops/lstm.h. It includes only that header, so nothing else of Quiver is
// compiled here with the relaxed floating-point rules.
#include "ops/lstm.h"

namespace quiver {

void lstm_cell_row_forward(float* cell, float* h, const float* pre, const float* c_prev, int64_t hidden) {
  const int64_t H = hidden;
#pragma GCC ivdep
  for (int64_t j = 0; j < H; ++j) {
    const math::LstmCell out = math::lstm_cell_forward(pre[j], pre[H + j], pre[2 * H + j], pre[3 * H + j], c_prev[j]);
    cell[j] = out.i;
    cell[H + j] = out.f;
    cell[2 * H + j] = out.g;
    cell[3 * H + j] = out.o;
    cell[4 * H + j] = out.c;
    h[j] = out.h;
  }
}

void lstm_cell_row_backward(float* d_pre, float* dc, const float* cell, const float* c_prev, const float* dh_step,
                            const float* dh_carry, int64_t hidden) {
  const int64_t H = hidden;
#pragma GCC ivdep
  for (int64_t j = 0; j < H; ++j) {
    const math::LstmCellGrad grad = math::lstm_cell_backward(cell[j], cell[H + j], cell[2 * H + j], cell[3 * H + j],
                                                             cell[4 * H + j], c_prev[j], dh_step[j] + dh_carry[j], dc[j]);
    d_pre[j] = grad.d_pre_i;
    d_pre[H + j] = grad.d_pre_f;
    d_pre[2 * H + j] = grad.d_pre_g;
    d_pre[3 * H + j] = grad.d_pre_o;
    dc[j] = grad.dc_prev;
  }
}

}  // namespace quiver
