#include "ops/pool.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "core/builder.h"
#include "ops/kernel_util.h"

namespace quiver {

PoolGeometry pool_geometry(const Shape& x, const Attrs& attrs) {
  PoolGeometry g;
  g.planes = x[0] * x[1];
  g.height = x[2];
  g.width = x[3];
  g.kernel = attrs.get_int("kernel");
  g.stride = attrs.get_int("stride", g.kernel);
  g.out_h = (g.height - g.kernel) / g.stride + 1;
  g.out_w = (g.width - g.kernel) / g.stride + 1;
  return g;
}

namespace {

// The pooled shape of x under the node's kernel and stride; fails where they do not fit. `what`
// names x in messages: the input, or the gradient op's "shape" attribute.
Shape pooled(const InferContext& ctx, const Shape& x, const char* what = "input") {
  if (x.rank() != 4) ctx.fail(cat(what, " ", x.str(), " must have rank 4"));
  int64_t kernel = ctx.node.attrs.get_int("kernel"), stride = ctx.node.attrs.get_int("stride", kernel);
  if (ctx.node.attrs.get_int("padding", 0) != 0)  // the kernels pool unpadded windows only
    ctx.fail(cat("padding ", ctx.node.attrs.get_int("padding"), " is not supported (pooling windows are unpadded)"));
  if (kernel < 1 || stride < 1 || kernel > x[2] || kernel > x[3])
    ctx.fail(cat("kernel ", kernel, " / stride ", stride, " invalid for ", x.str()));
  if (x[2] * x[3] > std::numeric_limits<int32_t>::max())  // the argmax is an int32 index into a plane
    ctx.fail(cat("a plane of ", x.str(), " has more than 2^31 - 1 elements"));
  PoolGeometry g = pool_geometry(x, ctx.node.attrs);
  return Shape{x[0], x[1], g.out_h, g.out_w};
}

std::vector<TensorType> infer(const InferContext& ctx) {
  expect_inputs(ctx, 1);
  expect_dtype(ctx, 0, DType::F32);
  const Shape out = pooled(ctx, ctx.shape(0));
  return {{out, DType::F32}, {out, DType::I32}};
}

// max_pool2d_grad (dy, argmax; "shape" = x's): both must be the pooled shape of x.
std::vector<TensorType> infer_grad(const InferContext& ctx) {
  expect_inputs(ctx, 2);
  expect_dtype(ctx, 0, DType::F32);
  expect_dtype(ctx, 1, DType::I32);
  const Shape full(ctx.node.attrs.get_ints("shape"));
  const Shape out = pooled(ctx, full, "attribute shape");
  if (ctx.shape(0) != out || ctx.shape(1) != out)
    ctx.fail(cat("gradient ", ctx.shape(0).str(), " and argmax ", ctx.shape(1).str(), " must both be ", out.str(),
                 ", the pooled shape of ", full.str()));
  return {{full, DType::F32}};
}

// One plane, kTile outputs at a time. `corners` holds each output's window corner (its first
// element's index in the plane). For every window element (kh, kw) in row-major order, a loop
// over the tile's outputs compares it with each output's maximum so far, without a branch, so the
// compiler vectorizes it (with gathers, as an output's corner need not follow its neighbour's
// by the stride where a tile spans rows): the maxima of ReLU outputs fall at random, and a branch per comparison
// is mispredicted about half the time. The rule is max_pool_argmax's: a later element wins only
// if it is larger, or a NaN where the maximum so far is not.
void max_pool_plane(const float* plane, const PoolGeometry& g, const int32_t* corners, float* y, int32_t* argmax) {
  constexpr int64_t kTile = 64;
  for (int64_t first = 0; first < g.out_plane(); first += kTile) {
    const int64_t count = std::min(kTile, g.out_plane() - first);
    const int32_t* corner = corners + first;
    float best[kTile];
    int32_t at[kTile];
    for (int64_t i = 0; i < count; ++i) {
      best[i] = plane[corner[i]];
      at[i] = corner[i];
    }
    for (int64_t kh = 0; kh < g.kernel; ++kh)
      for (int64_t kw = 0; kw < g.kernel; ++kw) {
        const int32_t shift = static_cast<int32_t>(kh * g.width + kw);
        for (int64_t i = 0; i < count; ++i) {
          const float value = plane[corner[i] + shift];
          const bool take = (value > best[i]) | ((value != value) & (best[i] == best[i]));  // v != v: NaN
          best[i] = take ? value : best[i];
          at[i] = take ? corner[i] + shift : at[i];
        }
      }
    std::copy_n(best, count, y + first);
    std::copy_n(at, count, argmax + first);
  }
}

KernelFn prepare_forward(const KernelSpec& spec) {
  PoolGeometry g = pool_geometry(spec.input(0).shape, spec.node.attrs);
  std::vector<int32_t> corners(g.out_plane());  // each output's window corner in its plane
  for (int64_t oh = 0; oh < g.out_h; ++oh)
    for (int64_t ow = 0; ow < g.out_w; ++ow)
      corners[oh * g.out_w + ow] = static_cast<int32_t>(oh * g.stride * g.width + ow * g.stride);
  return [g, corners = std::move(corners)](const KernelCall& call) {
    float* y = call.outputs[0].f32();          // (B*C, OH, OW)
    int32_t* argmax = call.outputs[1].i32();   // (B*C, OH, OW): index into the H*W plane
    const float* x = call.inputs[0].f32();     // (B*C, H, W)
    call.ctx.parallel_for(g.planes, 8, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p)
        max_pool_plane(x + p * g.plane(), g, corners.data(), y + p * g.out_plane(), argmax + p * g.out_plane());
    });
  };
}

KernelFn prepare_grad(const KernelSpec& spec) {
  PoolGeometry g = pool_geometry(spec.output(0).shape, spec.node.attrs);
  return [g](const KernelCall& call) {
    float* dx = call.outputs[0].f32();             // (B*C, H, W)
    const float* dy = call.inputs[0].f32();        // (B*C, OH, OW)
    const int32_t* argmax = call.inputs[1].i32();  // (B*C, OH, OW)
    const int64_t plane_size = g.height * g.width;
    // argmax comes from max_pool2d's forward, but the op is public (apply()): an index outside
    // the plane is refused rather than written through.
    std::atomic<int64_t> bad_index{-1};
    call.ctx.parallel_for(g.planes, 8, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        float* plane = dx + p * plane_size;
        std::fill_n(plane, plane_size, 0.0f);
        for (int64_t o = p * g.out_h * g.out_w; o < (p + 1) * g.out_h * g.out_w; ++o) {
          const int32_t at = argmax[o];
          if (at < 0 || at >= plane_size) {
            bad_index.store(o, std::memory_order_relaxed);
            continue;
          }
          plane[at] += dy[o];
        }
      }
    });
    if (const int64_t o = bad_index.load(); o >= 0)
      throw Error(cat("max_pool2d_grad '", call.node.name, "': argmax ", argmax[o], " at ", o,
                      " is outside the ", g.height, "x", g.width, " plane"));
  };
}

const bool registered = [] {
  OpDef def;
  def.kind = "max_pool2d";
  def.infer = infer;
  def.attributes = {"kernel", "stride", "padding"};  // padding: only 0, refused by name otherwise
  def.backward = [](GradContext& ctx) {
    Attrs attrs = ctx.node().attrs;
    attrs.set("shape", ctx.input_shape(0).dims());
    ctx.set_input_grad(0, ctx.builder().apply1("max_pool2d_grad", {ctx.output_grad(0), ctx.output(1)},
                                               attrs, ctx.name("input")));
  };
  def.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_forward});
  register_op(std::move(def));

  OpDef grad;
  grad.kind = "max_pool2d_grad";
  grad.infer = infer_grad;
  grad.attributes = {"kernel", "stride", "padding", "shape"};  // the forward's, and its input's shape
  grad.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_grad});
  return register_op(std::move(grad));
}();

}  // namespace

}  // namespace quiver
