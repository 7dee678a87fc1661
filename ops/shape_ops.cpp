#include "ops/shape_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/builder.h"
#include "ops/kernel_util.h"

namespace quiver {

namespace {

void copy_kernel(const KernelCall& call) {
  const Tensor& dst = call.outputs[0];
  const Tensor& src = call.inputs[0];
  if (dst.raw() == src.raw()) return;
  char* out = static_cast<char*>(dst.raw());
  const char* in = static_cast<const char*>(src.raw());
  call.ctx.parallel_for(dst.bytes(), kElementwiseGrain * 4, [&](int64_t begin, int64_t end) {
    std::memcpy(out + begin, in + begin, static_cast<size_t>(end - begin));
  });
}

std::vector<TensorType> infer_reshape(const InferContext& ctx) {
  expect_inputs(ctx, 1);
  Shape target(ctx.node.attrs.get_ints("shape"));
  if (target.numel() != ctx.shape(0).numel())
    ctx.fail(cat("cannot reshape ", ctx.shape(0).str(), " (", ctx.shape(0).numel(),
                 " elements) to ", target.str(), " (", target.numel(), " elements)"));
  return {{target, ctx.inputs[0].dtype}};
}

std::vector<TensorType> infer_fill(const InferContext& ctx) {
  expect_inputs(ctx, 0);
  // A double past float's range converts to float undefined (infinities convert as they are). A
  // missing value is the kernel's to name when it is prepared.
  const double value = ctx.node.attrs.get_float("value", 0.0);
  if (std::isfinite(value) && std::abs(value) > std::numeric_limits<float>::max())
    ctx.fail(cat("value ", value, " does not fit in a float32"));
  return {{Shape(ctx.node.attrs.get_ints("shape")), DType::F32}};
}

int64_t resolve_step(const Shape& x, int64_t step) { return step < 0 ? step + x[1] : step; }

std::vector<TensorType> infer_select_step(const InferContext& ctx) {
  expect_inputs(ctx, 1);
  expect_rank(ctx, 0, 3);
  expect_dtype(ctx, 0, DType::F32);  // its kernels copy floats (an int32 input was read as floats)
  const Shape& x = ctx.shape(0);
  int64_t step = resolve_step(x, ctx.node.attrs.get_int("step"));
  if (step < 0 || step >= x[1])
    ctx.fail(cat("step ", ctx.node.attrs.get_int("step"), " is outside 0..", x[1] - 1));
  return {{Shape{x[0], x[2]}, DType::F32}};
}

std::vector<TensorType> infer_select_step_grad(const InferContext& ctx) {
  expect_inputs(ctx, 1);
  expect_dtype(ctx, 0, DType::F32);
  Shape full(ctx.node.attrs.get_ints("shape"));
  if (full.rank() != 3 || ctx.shape(0) != Shape{full[0], full[2]})
    ctx.fail(cat("gradient ", ctx.shape(0).str(), " does not fit sequence ", full.str()));
  const int64_t step = resolve_step(full, ctx.node.attrs.get_int("step"));
  if (step < 0 || step >= full[1])
    ctx.fail(cat("step ", ctx.node.attrs.get_int("step"), " is outside 0..", full[1] - 1));
  return {{full, DType::F32}};
}

KernelFn prepare_select_step(const KernelSpec& spec) {
  Shape x = spec.input(0).shape;  // (B, T, H)
  int64_t step = resolve_step(x, spec.node.attrs.get_int("step"));
  return [x, step](const KernelCall& call) {
    float* dst = call.outputs[0].f32();       // (B, H)
    const float* src = call.inputs[0].f32();  // (B, T, H)
    for (int64_t b = 0; b < x[0]; ++b)
      std::memcpy(dst + b * x[2], src + (b * x[1] + step) * x[2], sizeof(float) * x[2]);
  };
}

KernelFn prepare_select_step_grad(const KernelSpec& spec) {
  Shape x = spec.output(0).shape;  // (B, T, H)
  int64_t step = resolve_step(x, spec.node.attrs.get_int("step"));
  return [x, step](const KernelCall& call) {
    float* dx = call.outputs[0].f32();       // (B, T, H)
    const float* dy = call.inputs[0].f32();  // (B, H)
    std::fill_n(dx, x.numel(), 0.0f);
    for (int64_t b = 0; b < x[0]; ++b)
      std::memcpy(dx + (b * x[1] + step) * x[2], dy + b * x[2], sizeof(float) * x[2]);
  };
}

OpDef make(const std::string& kind, std::function<std::vector<TensorType>(const InferContext&)> infer,
           std::function<KernelFn(const KernelSpec&)> prepare) {
  OpDef def;
  def.kind = kind;
  def.infer = std::move(infer);
  def.kernels.push_back({"reference", DeviceKind::CPU, nullptr, std::move(prepare)});
  return def;
}

const bool registered = [] {
  auto stateless = [](KernelFn fn) { return [fn](const KernelSpec&) { return fn; }; };

  OpDef reshape = make("reshape", infer_reshape, stateless(copy_kernel));
  reshape.attributes = {"shape"};
  reshape.backward = [](GradContext& ctx) {
    ctx.set_input_grad(0, ctx.builder().reshape(ctx.output_grad(0), ctx.input_shape(0), ctx.name("input")));
  };
  register_op(std::move(reshape));

  OpDef copy = make("copy", [](const InferContext& ctx) {
    expect_inputs(ctx, 1);
    return std::vector<TensorType>{ctx.inputs[0]};
  }, stateless(copy_kernel));
  copy.backward = [](GradContext& ctx) { ctx.set_input_grad(0, ctx.output_grad(0)); };
  register_op(std::move(copy));

  OpDef fill = make("fill", infer_fill, [](const KernelSpec& spec) -> KernelFn {
    float value = static_cast<float>(spec.node.attrs.get_float("value"));
    return [value](const KernelCall& call) { call.outputs[0].fill(value); };
  });
  fill.attributes = {"shape", "value"};
  register_op(std::move(fill));

  OpDef select = make("select_step", infer_select_step, prepare_select_step);
  select.attributes = {"step"};
  select.backward = [](GradContext& ctx) {
    Attrs attrs;
    attrs.set("step", ctx.node().attrs.get_int("step")).set("shape", ctx.input_shape(0).dims());
    ctx.set_input_grad(0, ctx.builder().apply1("select_step_grad", {ctx.output_grad(0)}, attrs,
                                               ctx.name("input")));
  };
  register_op(std::move(select));
  OpDef select_grad = make("select_step_grad", infer_select_step_grad, prepare_select_step_grad);
  select_grad.attributes = {"step", "shape"};  // the forward's, and its input's shape
  return register_op(std::move(select_grad));
}();

}  // namespace

}  // namespace quiver
