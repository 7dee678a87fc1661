#include "ops/conv2d.h"

#include <algorithm>
#include <vector>

#include "core/builder.h"
#include "ops/gemm.h"
#include "ops/kernel_util.h"

namespace quiver {

ConvGeometry conv_geometry(const Shape& x, const Shape& w, int64_t stride, int64_t padding) {
  ConvGeometry g;
  g.batch = x[0];
  g.channels = x[1];
  g.height = x[2];
  g.width = x[3];
  g.out_channels = w[0];
  g.kernel_h = w[2];
  g.kernel_w = w[3];
  g.stride = stride;
  g.padding = padding;
  g.out_h = (g.height + 2 * padding - g.kernel_h) / stride + 1;
  g.out_w = (g.width + 2 * padding - g.kernel_w) / stride + 1;
  return g;
}

void im2col(float* col, const float* image, const ConvGeometry& g) {
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
        float* row = col + ((c * g.kernel_h + kh) * g.kernel_w + kw) * g.out_plane();
        const float* plane = image + c * g.height * g.width;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          int64_t ih = oh * g.stride - g.padding + kh;
          float* out = row + oh * g.out_w;
          if (ih < 0 || ih >= g.height) {
            std::fill_n(out, g.out_w, 0.0f);
            continue;
          }
          const float* in = plane + ih * g.width;
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            int64_t iw = ow * g.stride - g.padding + kw;
            out[ow] = (iw >= 0 && iw < g.width) ? in[iw] : 0.0f;
          }
        }
      }
}

void col2im(float* image, const float* col, const ConvGeometry& g) {
  std::fill_n(image, g.channels * g.height * g.width, 0.0f);
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const float* row = col + ((c * g.kernel_h + kh) * g.kernel_w + kw) * g.out_plane();
        float* plane = image + c * g.height * g.width;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          int64_t ih = oh * g.stride - g.padding + kh;
          if (ih < 0 || ih >= g.height) continue;
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            int64_t iw = ow * g.stride - g.padding + kw;
            if (iw >= 0 && iw < g.width) plane[ih * g.width + iw] += row[oh * g.out_w + ow];
          }
        }
      }
}

namespace {

const SerialContext kOneThread;

// Scratch for one image's im2col matrix, reused by each thread across calls.
float* column_scratch(int64_t elements) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < elements) scratch.resize(elements);
  return scratch.data();
}

ConvGeometry geometry_of(const KernelSpec& spec, const Shape& x, const Shape& w) {
  return conv_geometry(x, w, spec.node.attrs.get_int("stride", 1), spec.node.attrs.get_int("padding", 0));
}

// The output of a convolution of input x (B, C, H, W) with weight w (O, C, KH, KW) under the
// node's stride and padding; fails naming both shapes where they do not fit, each as the caller
// calls it (a gradient's "attribute shape" is neither of its inputs).
Shape conv_output(const InferContext& ctx, const Shape& x, const Shape& w, const char* x_is = "input",
                  const char* w_is = "weight") {
  if (x.rank() != 4 || w.rank() != 4) ctx.fail(cat(x_is, " ", x.str(), " and ", w_is, " ", w.str(), " must have rank 4"));
  int64_t stride = ctx.node.attrs.get_int("stride", 1), padding = ctx.node.attrs.get_int("padding", 0);
  constexpr int64_t kLargest = int64_t{1} << 30;  // keeps x + 2*padding far from overflow
  if (stride < 1 || padding < 0 || stride > kLargest || padding > kLargest)
    ctx.fail(cat("stride ", stride, " / padding ", padding, " invalid"));
  if (w[1] != x[1])
    ctx.fail(cat(x_is, " ", x.str(), " has ", x[1], " channels but ", w_is, " ", w.str(), " expects ", w[1]));
  if (w[2] < 1 || w[3] < 1) ctx.fail(cat("kernel ", w[2], "x", w[3], " is empty"));
  // Checked before dividing: C++ division truncates toward zero, so (2 - 3) / 2 + 1 would be 1.
  if (x[2] + 2 * padding < w[2] || x[3] + 2 * padding < w[3])
    ctx.fail(cat("kernel ", w[2], "x", w[3], " does not fit ", x_is, " ", x.str(), " with padding ", padding));
  ConvGeometry g = conv_geometry(x, w, stride, padding);
  // One image's im2col matrix (patch x out_plane) is a kernel's scratch: its size must not overflow.
  if (g.out_plane() > (int64_t{1} << 59) / std::max<int64_t>(1, g.patch()))
    ctx.fail(cat(x_is, " ", x.str(), " and ", w_is, " ", w.str(), ": the im2col matrix of ", g.patch(), " x ",
                 g.out_plane(), " values is too large"));
  return Shape{g.batch, g.out_channels, g.out_h, g.out_w};
}

std::vector<TensorType> infer(const InferContext& ctx) {
  expect_inputs(ctx, 2);
  expect_dtype(ctx, 0, DType::F32);
  expect_dtype(ctx, 1, DType::F32);
  return {{conv_output(ctx, ctx.shape(0), ctx.shape(1)), DType::F32}};
}

// conv2d_grad_input (dy, w; "shape" = x's) and conv2d_grad_weight (dy, x; "shape" = w's): dy must
// be what the forward convolution of those shapes produces.
std::vector<TensorType> infer_grad(const InferContext& ctx) {
  expect_inputs(ctx, 2);
  expect_dtype(ctx, 0, DType::F32);
  expect_dtype(ctx, 1, DType::F32);
  const Shape full(ctx.node.attrs.get_ints("shape"));
  const bool of_input = ctx.node.op == "conv2d_grad_input";
  const Shape expected = of_input ? conv_output(ctx, full, ctx.shape(1), "attribute shape")
                                  : conv_output(ctx, ctx.shape(1), full, "input", "attribute shape");
  if (ctx.shape(0) != expected)
    ctx.fail(cat("gradient ", ctx.shape(0).str(), " does not match the convolution's output ", expected.str()));
  return {{full, DType::F32}};
}

KernelFn prepare_forward(const KernelSpec& spec) {
  ConvGeometry g = geometry_of(spec, spec.input(0).shape, spec.input(1).shape);
  return [g](const KernelCall& call) {
    float* y = call.outputs[0].f32();        // (B, O, OH, OW)
    const float* x = call.inputs[0].f32();   // (B, C, H, W)
    const float* w = call.inputs[1].f32();   // (O, C*KH*KW)
    GemmShape s{g.out_channels, g.out_plane(), g.patch()};
    call.ctx.parallel_for(g.batch, 1, [&](int64_t begin, int64_t end) {
      float* col = column_scratch(g.patch() * g.out_plane());
      for (int64_t n = begin; n < end; ++n) {
        im2col(col, x + n * g.channels * g.height * g.width, g);
        gemm(y + n * g.out_channels * g.out_plane(), w, col, s, kOneThread);
      }
    });
  };
}

KernelFn prepare_grad_input(const KernelSpec& spec) {
  // inputs: dy (B, O, OH, OW), w (O, C, KH, KW); output dx (B, C, H, W)
  ConvGeometry g = geometry_of(spec, spec.output(0).shape, spec.input(1).shape);
  return [g](const KernelCall& call) {
    float* dx = call.outputs[0].f32();
    const float* dy = call.inputs[0].f32();
    const float* w = call.inputs[1].f32();
    GemmShape s{g.patch(), g.out_plane(), g.out_channels, true, false};
    call.ctx.parallel_for(g.batch, 1, [&](int64_t begin, int64_t end) {
      float* col = column_scratch(g.patch() * g.out_plane());
      for (int64_t n = begin; n < end; ++n) {
        gemm(col, w, dy + n * g.out_channels * g.out_plane(), s, kOneThread);
        col2im(dx + n * g.channels * g.height * g.width, col, g);
      }
    });
  };
}

KernelFn prepare_grad_weight(const KernelSpec& spec) {
  // inputs: dy (B, O, OH, OW), x (B, C, H, W); output dw (O, C, KH, KW)
  ConvGeometry g = geometry_of(spec, spec.input(1).shape, spec.output(0).shape);
  return [g](const KernelCall& call) {
    float* dw = call.outputs[0].f32();
    const float* dy = call.inputs[0].f32();
    const float* x = call.inputs[1].f32();
    int64_t weights = g.out_channels * g.patch();
    if (g.batch == 0) {  // no samples: the gradient is zero
      std::fill_n(dw, weights, 0.0f);
      return;
    }
    int64_t slices = std::min<int64_t>(call.ctx.threads(), g.batch);
    // One partial dw per slice of the batch, summed at the end: no shared accumulator.
    std::vector<float> partial(static_cast<size_t>(slices * weights));
    call.ctx.parallel_for(slices, 1, [&](int64_t first, int64_t last) {
      float* col = column_scratch(g.patch() * g.out_plane());
      for (int64_t slice = first; slice < last; ++slice) {
        float* acc = partial.data() + slice * weights;
        for (int64_t n = g.batch * slice / slices; n < g.batch * (slice + 1) / slices; ++n) {
          im2col(col, x + n * g.channels * g.height * g.width, g);
          GemmShape s{g.out_channels, g.patch(), g.out_plane(), false, true, 1.0f,
                      n == g.batch * slice / slices ? 0.0f : 1.0f};
          gemm(acc, dy + n * g.out_channels * g.out_plane(), col, s, kOneThread);
        }
      }
    });
    std::copy_n(partial.data(), weights, dw);
    for (int64_t slice = 1; slice < slices; ++slice)
      for (int64_t i = 0; i < weights; ++i) dw[i] += partial[slice * weights + i];
  };
}

// Direct loops over every output element: slow, obviously right.
KernelFn prepare_reference(const KernelSpec& spec) {
  ConvGeometry g = geometry_of(spec, spec.input(0).shape, spec.input(1).shape);
  return [g](const KernelCall& call) {
    float* y = call.outputs[0].f32();
    const float* x = call.inputs[0].f32();
    const float* w = call.inputs[1].f32();
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t o = 0; o < g.out_channels; ++o)
        for (int64_t oh = 0; oh < g.out_h; ++oh)
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            double sum = 0.0;
            for (int64_t c = 0; c < g.channels; ++c)
              for (int64_t kh = 0; kh < g.kernel_h; ++kh)
                for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
                  int64_t ih = oh * g.stride - g.padding + kh, iw = ow * g.stride - g.padding + kw;
                  if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
                  sum += static_cast<double>(x[((n * g.channels + c) * g.height + ih) * g.width + iw]) *
                         w[((o * g.channels + c) * g.kernel_h + kh) * g.kernel_w + kw];
                }
            y[((n * g.out_channels + o) * g.out_h + oh) * g.out_w + ow] = static_cast<float>(sum);
          }
  };
}

// The gradients as direct loops, what the other kernels are tested against: dx gathers, for each
// input element, every output it fed (dx[n,c,ih,iw] = sum over o, kh, kw of dy[n,o,oh,ow] *
// w[o,c,kh,kw] where ih = oh*stride - padding + kh, likewise iw); dw sums over the batch and the
// output plane. Sums in double, each output element written once.
KernelFn prepare_reference_grad_input(const KernelSpec& spec) {
  // inputs: dy (B, O, OH, OW), w (O, C, KH, KW); output dx (B, C, H, W)
  ConvGeometry g = geometry_of(spec, spec.output(0).shape, spec.input(1).shape);
  return [g](const KernelCall& call) {
    float* dx = call.outputs[0].f32();
    const float* dy = call.inputs[0].f32();
    const float* w = call.inputs[1].f32();
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t c = 0; c < g.channels; ++c)
        for (int64_t ih = 0; ih < g.height; ++ih)
          for (int64_t iw = 0; iw < g.width; ++iw) {
            double sum = 0.0;
            for (int64_t kh = 0; kh < g.kernel_h; ++kh)
              for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
                const int64_t row = ih + g.padding - kh, column = iw + g.padding - kw;  // oh * stride, ow * stride
                if (row < 0 || column < 0 || row % g.stride != 0 || column % g.stride != 0) continue;
                const int64_t oh = row / g.stride, ow = column / g.stride;
                if (oh >= g.out_h || ow >= g.out_w) continue;
                for (int64_t o = 0; o < g.out_channels; ++o)
                  sum += static_cast<double>(dy[((n * g.out_channels + o) * g.out_h + oh) * g.out_w + ow]) *
                         w[((o * g.channels + c) * g.kernel_h + kh) * g.kernel_w + kw];
              }
            dx[((n * g.channels + c) * g.height + ih) * g.width + iw] = static_cast<float>(sum);
          }
  };
}

KernelFn prepare_reference_grad_weight(const KernelSpec& spec) {
  // inputs: dy (B, O, OH, OW), x (B, C, H, W); output dw (O, C, KH, KW)
  ConvGeometry g = geometry_of(spec, spec.input(1).shape, spec.output(0).shape);
  return [g](const KernelCall& call) {
    float* dw = call.outputs[0].f32();
    const float* dy = call.inputs[0].f32();
    const float* x = call.inputs[1].f32();
    for (int64_t o = 0; o < g.out_channels; ++o)
      for (int64_t c = 0; c < g.channels; ++c)
        for (int64_t kh = 0; kh < g.kernel_h; ++kh)
          for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
            double sum = 0.0;
            for (int64_t n = 0; n < g.batch; ++n)
              for (int64_t oh = 0; oh < g.out_h; ++oh)
                for (int64_t ow = 0; ow < g.out_w; ++ow) {
                  const int64_t ih = oh * g.stride - g.padding + kh, iw = ow * g.stride - g.padding + kw;
                  if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
                  sum += static_cast<double>(dy[((n * g.out_channels + o) * g.out_h + oh) * g.out_w + ow]) *
                         x[((n * g.channels + c) * g.height + ih) * g.width + iw];
                }
            dw[((o * g.channels + c) * g.kernel_h + kh) * g.kernel_w + kw] = static_cast<float>(sum);
          }
  };
}

const bool registered = [] {
  OpDef def;
  def.kind = "conv2d";
  def.infer = infer;
  def.attributes = {"stride", "padding"};
  def.backward = [](GradContext& ctx) {
    GraphBuilder& b = ctx.builder();
    Attrs attrs = ctx.node().attrs;
    Attrs input_attrs = attrs, weight_attrs = attrs;
    input_attrs.set("shape", ctx.input_shape(0).dims());
    weight_attrs.set("shape", ctx.input_shape(1).dims());
    if (ctx.needs_grad(0))
      ctx.set_input_grad(0, b.apply1("conv2d_grad_input", {ctx.output_grad(0), ctx.input(1)},
                                     input_attrs, ctx.name("input")));
    if (ctx.needs_grad(1))  // a fixed filter over a parameter input: its grad would run every step
      ctx.set_input_grad(1, b.apply1("conv2d_grad_weight", {ctx.output_grad(0), ctx.input(0)},
                                     weight_attrs, ctx.name("weight")));
  };
  def.kernels.push_back(onednn_conv2d_kernel());
  def.kernels.push_back({"im2col_gemm", DeviceKind::CPU, nullptr, prepare_forward});
  def.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_reference});
  register_op(std::move(def));

  OpDef grad_input;
  grad_input.kind = "conv2d_grad_input";
  grad_input.infer = infer_grad;
  grad_input.attributes = {"stride", "padding", "shape"};  // the forward's, and the input's shape
  grad_input.kernels.push_back(onednn_conv2d_grad_input_kernel());
  grad_input.kernels.push_back({"im2col_gemm", DeviceKind::CPU, nullptr, prepare_grad_input});
  grad_input.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_reference_grad_input});
  register_op(std::move(grad_input));

  OpDef grad_weight;
  grad_weight.kind = "conv2d_grad_weight";
  grad_weight.infer = infer_grad;
  grad_weight.attributes = {"stride", "padding", "shape"};  // the forward's, and the weight's shape
  grad_weight.kernels.push_back(onednn_conv2d_grad_weight_kernel());
  grad_weight.kernels.push_back({"im2col_gemm", DeviceKind::CPU, nullptr, prepare_grad_weight});
  grad_weight.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_reference_grad_weight});
  return register_op(std::move(grad_weight));
}();

}  // namespace

}  // namespace quiver
