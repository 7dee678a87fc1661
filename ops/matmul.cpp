#include "ops/matmul.h"

#include "core/builder.h"
#include "ops/gemm.h"
#include "ops/kernel_util.h"

namespace quiver {

namespace {


GemmShape gemm_shape(const Shape& a, const Shape& b, const Attrs& attrs) {
  GemmShape s;
  s.trans_a = attrs.get_int("trans_a", 0) != 0;
  s.trans_b = attrs.get_int("trans_b", 0) != 0;
  s.m = s.trans_a ? a[1] : a[0];
  s.k = s.trans_a ? a[0] : a[1];
  s.n = s.trans_b ? b[0] : b[1];
  return s;
}

std::vector<TensorType> infer(const InferContext& ctx) {
  expect_inputs(ctx, 2);
  expect_rank(ctx, 0, 2);
  expect_rank(ctx, 1, 2);
  expect_dtype(ctx, 0, DType::F32);
  expect_dtype(ctx, 1, DType::F32);
  const Shape& a = ctx.shape(0);
  const Shape& b = ctx.shape(1);
  GemmShape s = gemm_shape(a, b, ctx.node.attrs);
  int64_t k_of_b = s.trans_b ? b[1] : b[0];
  if (s.k != k_of_b)
    ctx.fail(cat("lhs ", a.str(), s.trans_a ? "^T" : "", " vs rhs ", b.str(), s.trans_b ? "^T" : "",
                 ": inner dimensions ", s.k, " and ", k_of_b, " differ"));
  return {{Shape{s.m, s.n}, DType::F32}};
}

void backward(GradContext& ctx) {
  GraphBuilder& b = ctx.builder();
  bool ta = ctx.node().attrs.get_int("trans_a", 0) != 0;
  bool tb = ctx.node().attrs.get_int("trans_b", 0) != 0;
  Value dc = ctx.output_grad(0);
  Value a = ctx.input(0), w = ctx.input(1);
  // d lhs and d rhs as (first, second, transpose first, transpose second) of another matmul.
  struct Product {
    Value first, second;
    bool trans_first, trans_second;
  };
  Product lhs = !ta ? Product{dc, w, false, !tb} : Product{w, dc, tb, true};
  Product rhs = !tb ? Product{a, dc, !ta, false} : Product{dc, a, true, ta};
  if (ctx.needs_grad(0))
    ctx.set_input_grad(0, b.matmul(lhs.first, lhs.second, lhs.trans_first, lhs.trans_second, ctx.name("lhs")));
  if (ctx.needs_grad(1))
    ctx.set_input_grad(1, b.matmul(rhs.first, rhs.second, rhs.trans_first, rhs.trans_second, ctx.name("rhs")));
}

KernelFn prepare_sgemm(const KernelSpec& spec) {
  GemmShape s = gemm_shape(spec.input(0).shape, spec.input(1).shape, spec.node.attrs);
  return [s](const KernelCall& call) {
    gemm(call.outputs[0].f32(), call.inputs[0].f32(), call.inputs[1].f32(), s, call.ctx);
  };
}

KernelFn prepare_reference(const KernelSpec& spec) {
  GemmShape s = gemm_shape(spec.input(0).shape, spec.input(1).shape, spec.node.attrs);
  return [s](const KernelCall& call) {
    gemm_reference(call.outputs[0].f32(), call.inputs[0].f32(), call.inputs[1].f32(), s);
  };
}

const bool registered = [] {
  OpDef def;
  def.kind = "matmul";
  def.infer = infer;
  def.attributes = {"trans_a", "trans_b"};
  def.backward = backward;
  def.kernels.push_back({"onednn_sgemm", DeviceKind::CPU, nullptr, prepare_sgemm});
  def.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_reference});
  return register_op(std::move(def));
}();

}  // namespace

}  // namespace quiver
