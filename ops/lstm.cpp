#include "ops/lstm.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "core/builder.h"
#include "ops/gemm.h"
#include "ops/kernel_util.h"

namespace quiver {

namespace {

struct LstmGeometry {
  int64_t batch = 0, steps = 0, input = 0, hidden = 0;
  int64_t gates() const { return 4 * hidden; }
};

LstmGeometry lstm_geometry(const Shape& x, const Shape& wh) { return {x[0], x[1], x[2], wh[0]}; }

// The recurrence in one parallel region per pass: batch rows never mix through time, so each of
// up to ctx.threads() contiguous chunks of rows is one body of the parallel loop and runs every
// step, with no barrier between steps. (Two regions a step, one for the recurrent GEMM and one for
// the cells, cost at batch 16 on two threads about what the second thread gave: 112 wake-ups a
// training step.) With fewer rows than threads the extra threads sit out the recurrence: a step
// of one row is a GEMV of a few microseconds, about what a wake-up costs.
// Where gemm() would cut the step's recurrent GEMM by rows (batch 16 on two threads), the chunks
// are its slices, and the results are the same bits as a GEMM and a cell loop a step at a time.
void for_row_chunks(int64_t batch, const ExecContext& ctx, const std::function<void(int64_t, int64_t)>& rows) {
  const int64_t chunks = std::min<int64_t>(ctx.threads(), batch);
  if (chunks <= 1) {
    rows(0, batch);
    return;
  }
  ctx.parallel_for(chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t chunk = first; chunk < last; ++chunk) rows(batch * chunk / chunks, batch * (chunk + 1) / chunks);
  });
}

std::vector<TensorType> infer(const InferContext& ctx) {
  expect_inputs(ctx, 4);
  expect_rank(ctx, 0, 3);
  expect_rank(ctx, 1, 2);
  expect_rank(ctx, 2, 2);
  expect_rank(ctx, 3, 1);
  for (int i = 0; i < 4; ++i) expect_dtype(ctx, i, DType::F32);
  const Shape &x = ctx.shape(0), &wx = ctx.shape(1), &wh = ctx.shape(2), &b = ctx.shape(3);
  int64_t hidden = wh[0];
  if (wh[1] != 4 * hidden) ctx.fail(cat("wh ", wh.str(), " must be (H, 4H)"));
  if (wx[0] != x[2] || wx[1] != 4 * hidden)
    ctx.fail(cat("wx ", wx.str(), " must be (", x[2], ", ", 4 * hidden, ") for input ", x.str()));
  if (b[0] != 4 * hidden) ctx.fail(cat("bias ", b.str(), " must be (", 4 * hidden, ")"));
  return {{Shape{x[0], x[1], hidden}, DType::F32}, {Shape{x[1], x[0], 5 * hidden}, DType::F32}};
}

// lstm_grad (dy, x, wx, wh, y, cache): the forward op's shapes, checked before the kernel trusts them.
std::vector<TensorType> infer_grad(const InferContext& ctx) {
  expect_inputs(ctx, 6);
  expect_rank(ctx, 1, 3);
  expect_rank(ctx, 2, 2);
  expect_rank(ctx, 3, 2);
  for (int i = 0; i < 6; ++i) expect_dtype(ctx, i, DType::F32);
  const Shape &x = ctx.shape(1), &wx = ctx.shape(2), &wh = ctx.shape(3);
  const int64_t hidden = wh[0];
  if (wh[1] != 4 * hidden || wx[0] != x[2] || wx[1] != 4 * hidden)
    ctx.fail(cat("weights wx ", wx.str(), " and wh ", wh.str(), " do not fit input ", x.str()));
  const Shape y{x[0], x[1], hidden}, cache{x[1], x[0], 5 * hidden};
  if (ctx.shape(0) != y || ctx.shape(4) != y || ctx.shape(5) != cache)
    ctx.fail(cat("dy ", ctx.shape(0).str(), ", y ", ctx.shape(4).str(), " and cache ", ctx.shape(5).str(),
                 " must be ", y.str(), ", ", y.str(), " and ", cache.str()));
  return {{ctx.shape(1), DType::F32}, {ctx.shape(2), DType::F32}, {ctx.shape(3), DType::F32},
          {Shape{ctx.shape(3)[1]}, DType::F32}};
}

KernelFn prepare_forward(const KernelSpec& spec) {
  LstmGeometry g = lstm_geometry(spec.input(0).shape, spec.input(2).shape);
  auto projected = std::make_shared<std::vector<float>>(g.batch * g.steps * g.gates());  // (B*T, 4H)
  auto gates = std::make_shared<std::vector<float>>(g.batch * g.gates());                 // (B, 4H)
  spec.scratch_bytes += static_cast<int64_t>(sizeof(float) * (projected->size() + gates->size()));
  return [g, projected, gates](const KernelCall& call) {
    float* h = call.outputs[0].f32();        // (B, T, H)
    float* cache = call.outputs[1].f32();    // (T, B, 5H)
    const float* x = call.inputs[0].f32();   // (B, T, I)
    const float* wx = call.inputs[1].f32();  // (I, 4H)
    const float* wh = call.inputs[2].f32();  // (H, 4H)
    const float* bias = call.inputs[3].f32();  // (4H)
    const int64_t H = g.hidden, G = g.gates();
    gemm(projected->data(), x, wx, GemmShape{g.batch * g.steps, G, g.input}, call.ctx);
    const std::vector<float> zeros(H, 0.0f);
    // Rows b0..b1 of the batch through all T steps, on one thread: the recurrent GEMM for those
    // rows, then their cells.
    auto recur = [&](int64_t b0, int64_t b1) {
      float* pre_rows = gates->data() + b0 * G;  // (rows, 4H): recurrent part, then all of it
      for (int64_t t = 0; t < g.steps; ++t) {
        if (t > 0) {
          GemmShape s{b1 - b0, G, H};
          s.lda = g.steps * H;
          gemm(pre_rows, h + (b0 * g.steps + t - 1) * H, wh, s, SerialContext());
        } else {
          std::fill_n(pre_rows, (b1 - b0) * G, 0.0f);
        }
        for (int64_t b = b0; b < b1; ++b) {
          float* pre = gates->data() + b * G;
          const float* input = projected->data() + (b * g.steps + t) * G;
          for (int64_t k = 0; k < G; ++k) pre[k] += input[k] + bias[k];
          float* out = cache + (t * g.batch + b) * 5 * H;
          const float* c_prev = t > 0 ? cache + ((t - 1) * g.batch + b) * 5 * H + 4 * H : zeros.data();
          lstm_cell_row_forward(out, h + (b * g.steps + t) * H, pre, c_prev, H);
        }
      }
    };
    for_row_chunks(g.batch, call.ctx, recur);
  };
}

KernelFn prepare_backward(const KernelSpec& spec) {
  // inputs: dh (B,T,H), x (B,T,I), wx (I,4H), wh (H,4H), h (B,T,H), cache (T,B,5H)
  LstmGeometry g = lstm_geometry(spec.input(1).shape, spec.input(3).shape);
  const bool input_grad = spec.node.attrs.get_int("input_grad", 1) != 0;
  const int64_t rows = g.batch * g.steps;
  auto dgates = std::make_shared<std::vector<float>>(rows * g.gates());        // (B*T, 4H)
  auto h_previous = std::make_shared<std::vector<float>>(rows * g.hidden);     // (B*T, H)
  auto dh_next = std::make_shared<std::vector<float>>(g.batch * g.hidden);     // (B, H)
  auto dc_next = std::make_shared<std::vector<float>>(g.batch * g.hidden);     // (B, H)
  auto wh_transposed = std::make_shared<std::vector<float>>(g.hidden * g.gates());  // (4H, H)
  spec.scratch_bytes += static_cast<int64_t>(sizeof(float) * (dgates->size() + h_previous->size() + dh_next->size() +
                                                              dc_next->size() + wh_transposed->size()));
  return [=](const KernelCall& call) {
    float* dx = call.outputs[0].f32();
    float* dwx = call.outputs[1].f32();
    float* dwh = call.outputs[2].f32();
    float* dbias = call.outputs[3].f32();
    const float* dh = call.inputs[0].f32();
    const float* x = call.inputs[1].f32();
    const float* wx = call.inputs[2].f32();
    const float* wh = call.inputs[3].f32();
    const float* h = call.inputs[4].f32();
    const float* cache = call.inputs[5].f32();
    const int64_t H = g.hidden, G = g.gates(), T = g.steps;
    float* dG = dgates->data();
    std::fill(dh_next->begin(), dh_next->end(), 0.0f);
    std::fill(dc_next->begin(), dc_next->end(), 0.0f);
    const std::vector<float> zeros(H, 0.0f);
    // The recurrent gradient dh(t-1) = dG(t) * wh^T, once per step, reads wh transposed: oneDNN's
    // sgemm takes 12.5 us for B (16, 512) x (512, 128) stored as such and 27.7 us with the same
    // product's B given transposed (one thread), so wh is transposed once per call.
    float* wh_t = wh_transposed->data();
    call.ctx.parallel_for(G, 16, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k)
        for (int64_t j = 0; j < H; ++j) wh_t[k * H + j] = wh[j * G + k];
    });
    // Rows b0..b1 back through all T steps, on one thread: their cells, then their part of the
    // recurrent gradient dh(t-1) = dG(t) * wh^T.
    auto recur = [&](int64_t b0, int64_t b1) {
      for (int64_t t = T - 1; t >= 0; --t) {
        for (int64_t b = b0; b < b1; ++b) {
          const float* cell = cache + (t * g.batch + b) * 5 * H;
          const float* c_prev = t > 0 ? cache + ((t - 1) * g.batch + b) * 5 * H + 4 * H : zeros.data();
          lstm_cell_row_backward(dG + (b * T + t) * G, dc_next->data() + b * H, cell, c_prev, dh + (b * T + t) * H,
                                 dh_next->data() + b * H, H);
        }
        if (t > 0) {
          GemmShape s{b1 - b0, H, G, false, false};
          s.lda = T * G;
          gemm(dh_next->data() + b0 * H, dG + (b0 * T + t) * G, wh_t, s, SerialContext());
        }
      }
    };
    for_row_chunks(g.batch, call.ctx, recur);
    float* hp = h_previous->data();
    for (int64_t b = 0; b < g.batch; ++b) {
      std::fill_n(hp + b * T * H, H, 0.0f);
      std::copy_n(h + b * T * H, (T - 1) * H, hp + (b * T + 1) * H);
    }
    gemm(dwx, x, dG, GemmShape{g.input, G, rows, true, false}, call.ctx);
    gemm(dwh, hp, dG, GemmShape{H, G, rows, true, false}, call.ctx);
    if (input_grad)
      gemm(dx, dG, wx, GemmShape{rows, g.input, G, false, true}, call.ctx);
    else
      std::fill_n(dx, rows * g.input, 0.0f);
    // Column sums of dG, a block of columns at a time along its rows (each column still summed in
    // row order): one column at a time strided by 4H floats and kept the loop scalar. In double,
    // as bias_grad and the reference sum: B x T rows of one sign would drift in float.
    call.ctx.parallel_for(G, 64, [&](int64_t begin, int64_t end) {
      constexpr int64_t kBlock = 64;
      for (int64_t first = begin; first < end; first += kBlock) {
        const int64_t width = std::min(kBlock, end - first);
        double sums[kBlock] = {};
        for (int64_t r = 0; r < rows; ++r) {
          const float* row = dG + r * G + first;
          for (int64_t k = 0; k < width; ++k) sums[k] += row[k];
        }
        for (int64_t k = 0; k < width; ++k) dbias[first + k] = static_cast<float>(sums[k]);
      }
    });
  };
}

// Plain loops, what the fused kernels are tested against: each step's pre-activations as direct
// sums in double, the cell math of ops/lstm.h (built here without -ffast-math), and the backward
// through time one row and step at a time, its weight sums in double. One thread.
KernelFn prepare_reference_forward(const KernelSpec& spec) {
  LstmGeometry g = lstm_geometry(spec.input(0).shape, spec.input(2).shape);
  return [g](const KernelCall& call) {
    float* h = call.outputs[0].f32();          // (B, T, H)
    float* cache = call.outputs[1].f32();      // (T, B, 5H): i, f, g, o, c
    const float* x = call.inputs[0].f32();     // (B, T, I)
    const float* wx = call.inputs[1].f32();    // (I, 4H)
    const float* wh = call.inputs[2].f32();    // (H, 4H)
    const float* bias = call.inputs[3].f32();  // (4H)
    const int64_t H = g.hidden, G = g.gates();
    std::vector<float> pre(static_cast<size_t>(G));
    for (int64_t t = 0; t < g.steps; ++t)
      for (int64_t b = 0; b < g.batch; ++b) {
        for (int64_t k = 0; k < G; ++k) {
          double sum = bias[k];
          for (int64_t i = 0; i < g.input; ++i) sum += static_cast<double>(x[(b * g.steps + t) * g.input + i]) * wx[i * G + k];
          if (t > 0)
            for (int64_t j = 0; j < H; ++j) sum += static_cast<double>(h[(b * g.steps + t - 1) * H + j]) * wh[j * G + k];
          pre[static_cast<size_t>(k)] = static_cast<float>(sum);
        }
        float* out = cache + (t * g.batch + b) * 5 * H;
        for (int64_t j = 0; j < H; ++j) {
          const float c_prev = t > 0 ? cache[((t - 1) * g.batch + b) * 5 * H + 4 * H + j] : 0.0f;
          const math::LstmCell cell = math::lstm_cell_forward(pre[j], pre[H + j], pre[2 * H + j], pre[3 * H + j], c_prev);
          out[j] = cell.i, out[H + j] = cell.f, out[2 * H + j] = cell.g, out[3 * H + j] = cell.o, out[4 * H + j] = cell.c;
          h[(b * g.steps + t) * H + j] = cell.h;
        }
      }
  };
}

KernelFn prepare_reference_backward(const KernelSpec& spec) {
  // inputs: dh (B,T,H), x (B,T,I), wx (I,4H), wh (H,4H), h (B,T,H), cache (T,B,5H)
  LstmGeometry g = lstm_geometry(spec.input(1).shape, spec.input(3).shape);
  const bool input_grad = spec.node.attrs.get_int("input_grad", 1) != 0;
  return [g, input_grad](const KernelCall& call) {
    float* dx = call.outputs[0].f32();     // (B, T, I)
    float* dwx = call.outputs[1].f32();    // (I, 4H)
    float* dwh = call.outputs[2].f32();    // (H, 4H)
    float* dbias = call.outputs[3].f32();  // (4H)
    const float* dh = call.inputs[0].f32();
    const float* x = call.inputs[1].f32();
    const float* wx = call.inputs[2].f32();
    const float* wh = call.inputs[3].f32();
    const float* h = call.inputs[4].f32();
    const float* cache = call.inputs[5].f32();
    const int64_t H = g.hidden, G = g.gates(), T = g.steps, I = g.input;
    std::vector<double> sum_wx(static_cast<size_t>(I * G)), sum_wh(static_cast<size_t>(H * G)), sum_bias(static_cast<size_t>(G));
    std::vector<float> d_pre(static_cast<size_t>(G));
    for (int64_t b = 0; b < g.batch; ++b) {
      std::vector<float> dh_carry(static_cast<size_t>(H), 0.0f), dc_carry(static_cast<size_t>(H), 0.0f);
      for (int64_t t = T - 1; t >= 0; --t) {
        const float* cell = cache + (t * g.batch + b) * 5 * H;
        for (int64_t j = 0; j < H; ++j) {
          const float c_prev = t > 0 ? cache[((t - 1) * g.batch + b) * 5 * H + 4 * H + j] : 0.0f;
          const math::LstmCellGrad grad =
              math::lstm_cell_backward(cell[j], cell[H + j], cell[2 * H + j], cell[3 * H + j], cell[4 * H + j], c_prev,
                                       dh[(b * T + t) * H + j] + dh_carry[j], dc_carry[j]);
          d_pre[j] = grad.d_pre_i, d_pre[H + j] = grad.d_pre_f, d_pre[2 * H + j] = grad.d_pre_g;
          d_pre[3 * H + j] = grad.d_pre_o, dc_carry[j] = grad.dc_prev;
        }
        for (int64_t k = 0; k < G; ++k) {
          sum_bias[k] += d_pre[k];
          for (int64_t i = 0; i < I; ++i) sum_wx[i * G + k] += static_cast<double>(x[(b * T + t) * I + i]) * d_pre[k];
          if (t > 0)
            for (int64_t j = 0; j < H; ++j) sum_wh[j * G + k] += static_cast<double>(h[(b * T + t - 1) * H + j]) * d_pre[k];
        }
        for (int64_t i = 0; i < I; ++i) {
          double sum = 0.0;
          if (input_grad)
            for (int64_t k = 0; k < G; ++k) sum += static_cast<double>(d_pre[k]) * wx[i * G + k];
          dx[(b * T + t) * I + i] = static_cast<float>(sum);
        }
        for (int64_t j = 0; j < H; ++j) {
          double sum = 0.0;
          for (int64_t k = 0; k < G; ++k) sum += static_cast<double>(d_pre[k]) * wh[j * G + k];
          dh_carry[j] = static_cast<float>(sum);
        }
      }
    }
    std::transform(sum_wx.begin(), sum_wx.end(), dwx, [](double v) { return static_cast<float>(v); });
    std::transform(sum_wh.begin(), sum_wh.end(), dwh, [](double v) { return static_cast<float>(v); });
    std::transform(sum_bias.begin(), sum_bias.end(), dbias, [](double v) { return static_cast<float>(v); });
  };
}

const bool registered = [] {
  OpDef def;
  def.kind = "lstm";
  def.infer = infer;
  def.backward = [](GradContext& ctx) {
    ctx.no_gradient_through(1, "the cache of gate activations");
    Attrs attrs;
    attrs.set("input_grad", int64_t{ctx.needs_grad(0)});  // the first layer's dx is never read
    std::vector<Value> grads = ctx.builder().apply(
        "lstm_grad",
        {ctx.output_grad(0), ctx.input(0), ctx.input(1), ctx.input(2), ctx.output(0), ctx.output(1)},
        attrs, ctx.name("all"));
    for (int i = 0; i < 4; ++i)
      if (i > 0 || ctx.needs_grad(0)) ctx.set_input_grad(i, grads[i]);
  };
  def.kernels.push_back({"fused", DeviceKind::CPU, nullptr, prepare_forward});
  def.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_reference_forward});
  register_op(std::move(def));

  OpDef grad;
  grad.kind = "lstm_grad";
  grad.infer = infer_grad;
  grad.attributes = {"input_grad"};
  grad.kernels.push_back({"fused", DeviceKind::CPU, nullptr, prepare_backward});
  grad.kernels.push_back({"reference", DeviceKind::CPU, nullptr, prepare_reference_backward});
  return register_op(std::move(grad));
}();

}  // namespace

}  // namespace quiver
