// max_pool2d: x (B, C, H, W) -> y (B, C, OH, OW), argmax (B, C, OH, OW) int32; attrs kernel and
// stride, no padding. Ties go to the first maximum in row-major window order, so the gradient
// (max_pool2d_grad, which routes dy to the recorded argmax) is deterministic.
#pragma once

#include <cstdint>

#include "core/graph.h"
#include "core/shape.h"
#include "ops/kernel_util.h"

namespace quiver {

struct PoolGeometry {
  int64_t planes = 0, height = 0, width = 0, kernel = 0, stride = 0, out_h = 0, out_w = 0;
  QUIVER_HD int64_t plane() const { return height * width; }
  QUIVER_HD int64_t out_plane() const { return out_h * out_w; }
};

// x (B, C, H, W) with attrs kernel and stride (default: the kernel).
PoolGeometry pool_geometry(const Shape& x, const Attrs& attrs);

namespace math {

// The index, within one (H, W) plane, of the maximum of output (oh, ow)'s window; the first
// maximum in row-major window order wins a tie, and the first NaN wins over any number, so a NaN
// in the window passes through as relu's does. CPU and CUDA kernels both call this.
QUIVER_HD inline int64_t max_pool_argmax(const float* plane, const PoolGeometry& g, int64_t oh, int64_t ow) {
  int64_t best = (oh * g.stride) * g.width + ow * g.stride;
  for (int64_t kh = 0; kh < g.kernel; ++kh)
    for (int64_t kw = 0; kw < g.kernel; ++kw) {
      const int64_t at = (oh * g.stride + kh) * g.width + ow * g.stride + kw;
      const float value = plane[at], best_value = plane[best];
      if (value > best_value || (value != value && best_value == best_value)) best = at;  // v != v: NaN
    }
  return best;
}

}  // namespace math

}  // namespace quiver
