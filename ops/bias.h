// bias_add: x (B, C, ...) + bias (C), broadcast along axis 1 (a Linear's (B, N) and a conv's
// (B, C, H, W) alike); bias_grad: its gradient, the sum of dy over every axis but 1.
// The per-element sum is math::add (ops/elementwise.h), shared with the CUDA kernel.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/shape.h"

namespace quiver {

// x (B, C, ...) viewed as (outer, channels, inner), the layout both devices' kernels walk.
struct BiasGeometry {
  int64_t outer = 0, channels = 0, inner = 0;
};

inline BiasGeometry bias_geometry(const Shape& x) {
  BiasGeometry g;
  g.outer = x[0];
  g.channels = x[1];
  g.inner = x.numel() / std::max<int64_t>(1, g.outer * g.channels);
  return g;
}

}  // namespace quiver
