#include "ops/elementwise.h"

#include <cmath>

#include "core/builder.h"

namespace quiver {

namespace {

std::vector<TensorType> same_shape_unary(const InferContext& ctx) {
  expect_inputs(ctx, 1);
  expect_dtype(ctx, 0, DType::F32);
  return {{ctx.shape(0), DType::F32}};
}

std::vector<TensorType> same_shape_binary(const InferContext& ctx) {
  expect_inputs(ctx, 2);
  expect_dtype(ctx, 0, DType::F32);
  expect_dtype(ctx, 1, DType::F32);
  if (ctx.shape(0) != ctx.shape(1))
    ctx.fail(cat("lhs ", ctx.shape(0).str(), " vs rhs ", ctx.shape(1).str(), ": shapes differ"));
  return {{ctx.shape(0), DType::F32}};
}

// Fn is a lambda (a distinct type, so the per-element call inlines and the loop vectorizes),
// never a function pointer.
template <typename Fn>
KernelFn unary_kernel(Fn fn) {
  return [fn](const KernelCall& call) {
    float* dst = call.outputs[0].f32();
    const float* src = call.inputs[0].f32();
    call.ctx.parallel_for(call.outputs[0].numel(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dst[i] = fn(src[i]);
    });
  };
}

template <typename Fn>
KernelFn binary_kernel(Fn fn) {
  return [fn](const KernelCall& call) {
    float* dst = call.outputs[0].f32();
    const float* lhs = call.inputs[0].f32();
    const float* rhs = call.inputs[1].f32();
    call.ctx.parallel_for(call.outputs[0].numel(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dst[i] = fn(lhs[i], rhs[i]);
    });
  };
}

void register_elementwise(const std::string& kind, bool binary, KernelFn kernel,
                          std::function<void(GradContext&)> backward) {
  OpDef def;
  def.kind = kind;
  def.infer = binary ? same_shape_binary : same_shape_unary;
  def.backward = std::move(backward);
  def.kernels.push_back(cpu_kernel("reference", std::move(kernel)));
  register_op(std::move(def));
}

// Activation gradients read the forward output: grad_op(dy, y).
std::function<void(GradContext&)> activation_backward(const std::string& grad_op) {
  return [grad_op](GradContext& ctx) {
    ctx.set_input_grad(0, ctx.builder().apply1(grad_op, {ctx.output_grad(0), ctx.output(0)}, {},
                                               ctx.name("input")));
  };
}

const bool registered = [] {
  register_elementwise("add", true, binary_kernel([](float a, float b) { return math::add(a, b); }),
                       [](GradContext& ctx) {
                         ctx.set_input_grad(0, ctx.output_grad(0));
                         ctx.set_input_grad(1, ctx.output_grad(0));
                       });
  register_elementwise("mul", true, binary_kernel([](float a, float b) { return math::mul(a, b); }),
                       [](GradContext& ctx) {
                         // Only the gradients wanted: an unwanted one that reads a parameter would
                         // still run every step, as a reader the parameter's update waits for.
                         GraphBuilder& b = ctx.builder();
                         if (ctx.needs_grad(0))
                           ctx.set_input_grad(0, b.mul(ctx.output_grad(0), ctx.input(1), ctx.name("lhs")));
                         if (ctx.needs_grad(1))
                           ctx.set_input_grad(1, b.mul(ctx.output_grad(0), ctx.input(0), ctx.name("rhs")));
                       });
  register_elementwise("relu", false, unary_kernel([](float x) { return math::relu(x); }), activation_backward("relu_grad"));
  register_elementwise("sigmoid", false, unary_kernel([](float x) { return math::sigmoid(x); }),
                       activation_backward("sigmoid_grad"));
  register_elementwise("tanh", false, unary_kernel([](float x) { return math::tanh(x); }),
                       activation_backward("tanh_grad"));
  register_elementwise("relu_grad", true, binary_kernel([](float dy, float y) { return math::relu_grad(dy, y); }), nullptr);
  register_elementwise("sigmoid_grad", true, binary_kernel([](float dy, float y) { return math::sigmoid_grad(dy, y); }), nullptr);
  register_elementwise("tanh_grad", true, binary_kernel([](float dy, float y) { return math::tanh_grad(dy, y); }), nullptr);
  return true;
}();

}  // namespace

}  // namespace quiver
