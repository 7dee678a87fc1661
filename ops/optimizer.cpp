#include "ops/optimizer.h"

namespace quiver {

namespace {

std::vector<TensorType> infer_update(const InferContext& ctx, size_t inputs, size_t tensors) {
  expect_inputs(ctx, inputs);
  for (size_t i = 0; i < inputs; ++i) expect_dtype(ctx, static_cast<int>(i), DType::F32);  // lr and step too
  for (size_t i = 1; i < tensors; ++i)
    if (ctx.shape(static_cast<int>(i)) != ctx.shape(0))
      ctx.fail(cat("input ", i, " ", ctx.shape(static_cast<int>(i)).str(),
                   " does not match the parameter ", ctx.shape(0).str()));
  for (size_t i = tensors; i < inputs; ++i)
    if (ctx.shape(static_cast<int>(i)).numel() != 1)
      ctx.fail(cat("input ", i, " must hold one number, got ", ctx.shape(static_cast<int>(i)).str()));
  return {};
}

KernelFn prepare_sgd(const KernelSpec& spec) {
  float momentum = static_cast<float>(spec.node.attrs.get_float("momentum", 0.0));
  float weight_decay = static_cast<float>(spec.node.attrs.get_float("weight_decay", 0.0));
  return [momentum, weight_decay](const KernelCall& call) {
    float* w = call.inputs[0].f32();
    const float* g = call.inputs[1].f32();
    float* v = call.inputs[2].f32();
    float lr = call.inputs[3].f32()[0];
    call.ctx.parallel_for(call.inputs[0].numel(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) math::sgd_step(w[i], v[i], g[i], lr, momentum, weight_decay);
    });
  };
}

KernelFn prepare_adam(const KernelSpec& spec) {
  const auto [beta1, beta2, epsilon, weight_decay] = adam_attrs(spec.node.attrs);
  return [=](const KernelCall& call) {
    float* w = call.inputs[0].f32();
    const float* g = call.inputs[1].f32();
    float* m = call.inputs[2].f32();
    float* v = call.inputs[3].f32();
    float lr = call.inputs[4].f32()[0];
    float step = call.inputs[5].f32()[0];
    if (!(step >= 1.0f)) throw Error(cat("adam_update '", call.node.name, "': step must be >= 1, got ", step));
    const math::AdamCorrection correction = math::adam_correction(beta1, beta2, step);
    call.ctx.parallel_for(call.inputs[0].numel(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        math::adam_step(w[i], m[i], v[i], g[i], lr, beta1, beta2, epsilon, weight_decay, correction);
    });
  };
}

const bool registered = [] {
  OpDef sgd;
  sgd.kind = "sgd_update";
  sgd.infer = [](const InferContext& ctx) { return infer_update(ctx, 4, 3); };
  sgd.attributes = {"momentum", "weight_decay"};
  sgd.written_inputs = {0, 2};  // w, velocity
  sgd.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_sgd});
  register_op(std::move(sgd));

  OpDef adam;
  adam.kind = "adam_update";
  adam.infer = [](const InferContext& ctx) { return infer_update(ctx, 6, 4); };
  adam.attributes = {"beta1", "beta2", "epsilon", "weight_decay"};
  adam.written_inputs = {0, 2, 3};  // w, m, v
  adam.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_adam});
  return register_op(std::move(adam));
}();

}  // namespace

}  // namespace quiver
