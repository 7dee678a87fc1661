#include "ops/softmax_cross_entropy.h"

#include <cmath>

#include "core/builder.h"
#include "ops/kernel_util.h"

namespace quiver {

namespace {

std::vector<TensorType> infer(const InferContext& ctx) {
  expect_inputs(ctx, 2);
  expect_rank(ctx, 0, 2);
  expect_rank(ctx, 1, 1);
  expect_dtype(ctx, 0, DType::F32);
  expect_dtype(ctx, 1, DType::I32);
  if (ctx.shape(1)[0] != ctx.shape(0)[0])
    ctx.fail(cat("logits ", ctx.shape(0).str(), " vs labels ", ctx.shape(1).str(),
                 ": batch sizes differ"));
  return {{Shape{}, DType::F32}, {ctx.shape(0), DType::F32}};
}

// softmax_cross_entropy_grad (dloss, probs, labels).
std::vector<TensorType> infer_grad(const InferContext& ctx) {
  expect_inputs(ctx, 3);
  expect_rank(ctx, 1, 2);
  expect_rank(ctx, 2, 1);
  expect_dtype(ctx, 0, DType::F32);
  expect_dtype(ctx, 1, DType::F32);
  expect_dtype(ctx, 2, DType::I32);
  if (ctx.shape(0).numel() != 1) ctx.fail(cat("loss gradient ", ctx.shape(0).str(), " must be a scalar"));
  if (ctx.shape(2)[0] != ctx.shape(1)[0])
    ctx.fail(cat("probabilities ", ctx.shape(1).str(), " vs labels ", ctx.shape(2).str(), ": batch sizes differ"));
  return {{ctx.shape(1), DType::F32}};
}

void check_label(const KernelCall& call, int32_t label, int64_t classes, int64_t row) {
  if (label < 0 || label >= classes)
    throw Error(cat(call.node.op, " '", call.node.name, "': label ", label, " at row ", row,
                    " is outside 0..", classes - 1));
}

KernelFn prepare(const KernelSpec& spec) {
  int64_t batch = spec.input(0).shape[0], classes = spec.input(0).shape[1];
  return [batch, classes](const KernelCall& call) {
    float* loss = call.outputs[0].f32();           // ()
    float* probs = call.outputs[1].f32();          // (B, C)
    const float* logits = call.inputs[0].f32();    // (B, C)
    const int32_t* labels = call.inputs[1].i32();  // (B)
    double total = 0.0;
    for (int64_t b = 0; b < batch; ++b) {
      const float* row = logits + b * classes;
      float* p = probs + b * classes;
      check_label(call, labels[b], classes, b);
      float max_logit = row[0];
      for (int64_t c = 1; c < classes; ++c) max_logit = std::max(max_logit, row[c]);
      double sum = 0.0;
      for (int64_t c = 0; c < classes; ++c) {
        p[c] = math::softmax_shifted_exp(row[c], max_logit);
        sum += p[c];
      }
      for (int64_t c = 0; c < classes; ++c) p[c] = math::softmax_normalize(p[c], sum);
      total += math::softmax_cross_entropy_row(sum, max_logit, row[labels[b]]);
    }
    loss[0] = static_cast<float>(total / static_cast<double>(batch));
  };
}

KernelFn prepare_grad(const KernelSpec& spec) {
  int64_t batch = spec.input(1).shape[0], classes = spec.input(1).shape[1];
  return [batch, classes](const KernelCall& call) {
    float* dlogits = call.outputs[0].f32();        // (B, C)
    const float dloss = call.inputs[0].f32()[0];   // ()
    const float* probs = call.inputs[1].f32();     // (B, C)
    const int32_t* labels = call.inputs[2].i32();  // (B)
    float scale = dloss / static_cast<float>(batch);
    for (int64_t b = 0; b < batch; ++b) {
      check_label(call, labels[b], classes, b);
      for (int64_t c = 0; c < classes; ++c)
        dlogits[b * classes + c] = math::softmax_cross_entropy_grad(probs[b * classes + c], c == labels[b], scale);
    }
  };
}

const bool registered = [] {
  OpDef def;
  def.kind = "softmax_cross_entropy";
  def.infer = infer;
  def.backward = [](GradContext& ctx) {
    ctx.no_gradient_through(1, "the probabilities");
    ctx.set_input_grad(0, ctx.builder().apply1("softmax_cross_entropy_grad",
                                               {ctx.output_grad(0), ctx.output(1), ctx.input(1)},
                                               {}, ctx.name("logits")));
  };
  def.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare});
  register_op(std::move(def));

  OpDef grad;
  grad.kind = "softmax_cross_entropy_grad";
  grad.infer = infer_grad;
  grad.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_grad});
  return register_op(std::move(grad));
}();

}  // namespace

}  // namespace quiver
