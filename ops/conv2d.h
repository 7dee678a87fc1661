// conv2d: x (B, C, H, W) * w (O, C, KH, KW) -> (B, O, OH, OW), attrs stride and padding (square).
// Kernels, in registry order: oneDNN's JIT convolutions on batch slices (conv2d_onednn.cpp),
// im2col + GEMM per image (each GEMM single-threaded, images spread over the granted threads),
// and a direct-loop reference. The gradient ops conv2d_grad_input and
// conv2d_grad_weight are independent nodes, so the executor may run them side by side.
#pragma once

#include <cstdint>

#include "core/op.h"
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

// The oneDNN kernels (conv2d_onednn.cpp), registered ahead of im2col + GEMM.
KernelImpl onednn_conv2d_kernel();
KernelImpl onednn_conv2d_grad_input_kernel();
KernelImpl onednn_conv2d_grad_weight_kernel();

}  // namespace quiver
