#include "ops/bias.h"

#include <algorithm>

#include "core/builder.h"
#include "ops/elementwise.h"
#include "ops/kernel_util.h"

namespace quiver {

namespace {

std::vector<TensorType> infer_bias_add(const InferContext& ctx) {
  expect_inputs(ctx, 2);
  if (ctx.shape(0).rank() < 2) ctx.fail("input must have rank >= 2 (B, C, ...)");
  expect_rank(ctx, 1, 1);
  expect_dtype(ctx, 0, DType::F32);
  expect_dtype(ctx, 1, DType::F32);
  if (ctx.shape(1)[0] != ctx.shape(0)[1])
    ctx.fail(cat("bias ", ctx.shape(1).str(), " does not match axis 1 of input ", ctx.shape(0).str()));
  return {{ctx.shape(0), DType::F32}};
}

std::vector<TensorType> infer_bias_grad(const InferContext& ctx) {
  expect_inputs(ctx, 1);
  if (ctx.shape(0).rank() < 2) ctx.fail("input must have rank >= 2 (B, C, ...)");
  expect_dtype(ctx, 0, DType::F32);
  return {{Shape{ctx.shape(0)[1]}, DType::F32}};
}

KernelFn prepare_bias_add(const KernelSpec& spec) {
  BiasGeometry g = bias_geometry(spec.input(0).shape);
  return [g](const KernelCall& call) {
    float* dst = call.outputs[0].f32();        // (outer, C, inner)
    const float* src = call.inputs[0].f32();   // (outer, C, inner)
    const float* bias = call.inputs[1].f32();  // (C)
    if (g.inner == 1) {  // a dense layer's (B, C): a row of C per sample, the bias added along it
      const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, g.channels));
      call.ctx.parallel_for(g.outer, grain, [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o) {
          const float* in = src + o * g.channels;
          float* out = dst + o * g.channels;
          for (int64_t c = 0; c < g.channels; ++c) out[c] = math::add(in[c], bias[c]);
        }
      });
      return;
    }
    const int64_t rows = g.outer * g.channels;
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / g.inner);
    call.ctx.parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const float value = bias[row % g.channels];
        const float* in = src + row * g.inner;
        float* out = dst + row * g.inner;
        for (int64_t i = 0; i < g.inner; ++i) out[i] = math::add(in[i], value);
      }
    });
  };
}

// The sum of n floats in kLanes independent partial sums, so the loop vectorizes (one running
// float sum is a chain of dependent adds the compiler may not reorder), the lanes added into a
// double every kRun floats: a lane adds at most kRun / kLanes floats (a 224 x 224 plane held in
// float lanes would add 3136 each, drifting where the (B, C) path and the CUDA kernel sum in double).
double sum_in_lanes(const float* x, int64_t n) {
  constexpr int64_t kLanes = 16, kRun = 16 * kLanes;
  double sum = 0.0;
  int64_t i = 0;
  while (i + kLanes <= n) {
    float lanes[kLanes] = {};
    for (const int64_t end = i + std::min(kRun, (n - i) / kLanes * kLanes); i < end; i += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += x[i + l];
    for (int64_t l = 0; l < kLanes; ++l) sum += lanes[l];
  }
  for (; i < n; ++i) sum += x[i];
  return sum;
}

KernelFn prepare_bias_grad(const KernelSpec& spec) {
  BiasGeometry g = bias_geometry(spec.input(0).shape);
  return [g](const KernelCall& call) {
    float* dbias = call.outputs[0].f32();     // (C)
    const float* dy = call.inputs[0].f32();   // (outer, C, inner)
    if (g.inner == 1) {  // (B, C): column sums, a block of columns at a time along the rows
      constexpr int64_t kBlock = 256;
      call.ctx.parallel_for((g.channels + kBlock - 1) / kBlock, 1, [&](int64_t begin, int64_t end) {
        for (int64_t block = begin; block < end; ++block) {
          const int64_t first = block * kBlock, width = std::min(kBlock, g.channels - first);
          double sums[kBlock] = {};
          for (int64_t o = 0; o < g.outer; ++o) {
            const float* row = dy + o * g.channels + first;
            for (int64_t c = 0; c < width; ++c) sums[c] += row[c];
          }
          for (int64_t c = 0; c < width; ++c) dbias[first + c] = static_cast<float>(sums[c]);
        }
      });
      return;
    }
    call.ctx.parallel_for(g.channels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        double sum = 0.0;
        for (int64_t o = 0; o < g.outer; ++o) sum += sum_in_lanes(dy + (o * g.channels + c) * g.inner, g.inner);
        dbias[c] = static_cast<float>(sum);
      }
    });
  };
}

const bool registered = [] {
  OpDef add;
  add.kind = "bias_add";
  add.infer = infer_bias_add;
  add.backward = [](GradContext& ctx) {
    ctx.set_input_grad(0, ctx.output_grad(0));
    ctx.set_input_grad(1, ctx.builder().apply1("bias_grad", {ctx.output_grad(0)}, {}, ctx.name("bias")));
  };
  add.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_bias_add});
  register_op(std::move(add));

  OpDef grad;
  grad.kind = "bias_grad";
  grad.infer = infer_bias_grad;
  grad.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_bias_grad});
  return register_op(std::move(grad));
}();

}  // namespace

}  // namespace quiver
