// conv2d: x (B, C, H, W) * w (O, C, KH, KW) -> (B, O, OH, OW), attrs stride and padding (square).
// Kernels: im2col + GEMM per image, images spread over the granted threads (each GEMM
// single-threaded), and a direct-loop reference. The gradient ops conv2d_grad_input and
// conv2d_grad_weight are independent nodes, so the executor may run them side by side.
#pragma once

#include <cstdint>

#include "core/shape.h"

namespace quiver {

struct ConvGeometry {
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  int64_t out_channels = 0, kernel_h = 0, kernel_w = 0, stride = 1, padding = 0;
  int64_t out_h = 0, out_w = 0;
  int64_t patch() const { return channels * kernel_h * kernel_w; }  // rows of im2col
  int64_t out_plane() const { return out_h * out_w; }
};

ConvGeometry conv_geometry(const Shape& x, const Shape& w, int64_t stride, int64_t padding);

// col (C*KH*KW, OH*OW) <- the patches of one image x (C, H, W).
void im2col(float* col, const float* image, const ConvGeometry& g);
// image (C, H, W) <- the sum of the patches in col; overwrites image.
void col2im(float* image, const float* col, const ConvGeometry& g);

}  // namespace quiver
