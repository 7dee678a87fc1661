// Elementwise ops: add, mul, relu, sigmoid, tanh, and the gradient ops their backward emits
// (relu_grad, sigmoid_grad, tanh_grad, each reading the forward output). The per-element math is
// in QUIVER_HD functions so the CUDA kernels reuse it.
#pragma once

#include <cmath>

#include "ops/kernel_util.h"

namespace quiver::math {

// NaN passes through, as in other frameworks, so a diverged run is seen rather than hidden.
QUIVER_HD inline float add(float a, float b) { return a + b; }
QUIVER_HD inline float mul(float a, float b) { return a * b; }
QUIVER_HD inline float relu(float x) { return x < 0.0f ? 0.0f : x; }
QUIVER_HD inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
QUIVER_HD inline float tanh(float x) { return std::tanh(x); }
// Gradients through the forward output y: they need no saved input.
// relu's passes dy where y is NaN (not below the kink), as relu passes a NaN x.
QUIVER_HD inline float relu_grad(float dy, float y) { return y <= 0.0f ? 0.0f : dy; }
QUIVER_HD inline float sigmoid_grad(float dy, float y) { return dy * y * (1.0f - y); }
QUIVER_HD inline float tanh_grad(float dy, float y) { return dy * (1.0f - y * y); }

}  // namespace quiver::math
