// Every op: forward against a naive or closed-form reference, and its gradient against finite
// differences, through the one harness (op_harness.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <malloc.h>
#include <random>
#include <set>

#include <omp.h>

#include "core/autodiff.h"
#include "core/error.h"
#include "ops/conv2d.h"
#include "ops/gemm.h"
#include "ops/pool.h"
#include "runtime/param_store.h"
#include "runtime/plan.h"
#include "runtime/thread_budget.h"
#include "tests/ops/op_harness.h"

namespace quiver::testing {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

Host matmul_reference(const Host& a, const Host& b, int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
  Host c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        c[i * n + j] += (ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
  return c;
}

OpCase matmul_case(bool ta, bool tb, int64_t m = 5, int64_t n = 7, int64_t k = 6) {
  OpCase c;
  c.name = cat("matmul", ta ? "_ta" : "", tb ? "_tb" : "", m == 5 && n == 7 && k == 6 ? "" : cat("_", m, "x", n, "x", k));
  c.inputs = {{ta ? Shape{k, m} : Shape{m, k}}, {tb ? Shape{n, k} : Shape{k, n}}};
  c.build = [=](GraphBuilder& b, const std::vector<Value>& in) { return b.matmul(in[0], in[1], ta, tb); };
  c.reference = [=](const std::vector<Host>& in) { return matmul_reference(in[0], in[1], m, n, k, ta, tb); };
  return c;
}

OpCase unary_case(const std::string& name, Draw draw, std::function<double(double)> fn) {
  OpCase c;
  c.name = name;
  c.inputs = {{Shape{4, 9}, draw}};
  c.build = [name](GraphBuilder& b, const std::vector<Value>& in) { return b.apply1(name, {in[0]}); };
  c.reference = [fn](const std::vector<Host>& in) {
    Host out(in[0].size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = fn(in[0][i]);
    return out;
  };
  return c;
}

OpCase binary_case(const std::string& name, std::function<double(double, double)> fn) {
  OpCase c;
  c.name = name;
  c.inputs = {{Shape{3, 8}}, {Shape{3, 8}}};
  c.build = [name](GraphBuilder& b, const std::vector<Value>& in) { return b.apply1(name, {in[0], in[1]}); };
  c.reference = [fn](const std::vector<Host>& in) {
    Host out(in[0].size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = fn(in[0][i], in[1][i]);
    return out;
  };
  return c;
}

OpCase bias_add_case(Shape x) {
  OpCase c;
  c.name = "bias_add" + x.str();
  c.inputs = {{x}, {Shape{x[1]}}};
  c.build = [](GraphBuilder& b, const std::vector<Value>& in) { return b.bias_add(in[0], in[1]); };
  c.reference = [x](const std::vector<Host>& in) {
    Host out = in[0];
    int64_t inner = x.numel() / (x[0] * x[1]);
    for (size_t i = 0; i < out.size(); ++i) out[i] += in[1][(i / inner) % x[1]];
    return out;
  };
  return c;
}

OpCase conv_case(Shape x, Shape w, int64_t stride, int64_t padding) {
  OpCase c;
  c.name = cat("conv2d", x.str(), w.str(), "_s", stride, "_p", padding);
  c.inputs = {{x}, {w}};
  c.build = [=](GraphBuilder& b, const std::vector<Value>& in) {
    return b.conv2d(in[0], in[1], Conv2dAttrs{stride, padding});
  };
  c.reference = [=](const std::vector<Host>& in) {
    ConvGeometry g = conv_geometry(x, w, stride, padding);
    Host y(g.batch * g.out_channels * g.out_plane(), 0.0);
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t o = 0; o < g.out_channels; ++o)
        for (int64_t oh = 0; oh < g.out_h; ++oh)
          for (int64_t ow = 0; ow < g.out_w; ++ow)
            for (int64_t ch = 0; ch < g.channels; ++ch)
              for (int64_t kh = 0; kh < g.kernel_h; ++kh)
                for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
                  int64_t ih = oh * stride - padding + kh, iw = ow * stride - padding + kw;
                  if (ih < 0 || iw < 0 || ih >= g.height || iw >= g.width) continue;
                  y[((n * g.out_channels + o) * g.out_h + oh) * g.out_w + ow] +=
                      in[0][((n * g.channels + ch) * g.height + ih) * g.width + iw] *
                      in[1][((o * g.channels + ch) * g.kernel_h + kh) * g.kernel_w + kw];
                }
    return y;
  };
  return c;
}

OpCase max_pool_case(Shape x, int64_t kernel, int64_t stride) {
  OpCase c;
  c.name = cat("max_pool2d", x.str(), "_k", kernel, "_s", stride);
  c.inputs = {{x, Draw::Distinct}};
  c.build = [=](GraphBuilder& b, const std::vector<Value>& in) { return b.max_pool2d(in[0], kernel, stride); };
  c.reference = [=](const std::vector<Host>& in) {
    int64_t oh = (x[2] - kernel) / stride + 1, ow = (x[3] - kernel) / stride + 1;
    Host y;
    for (int64_t p = 0; p < x[0] * x[1]; ++p)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double best = -1e300;
          for (int64_t a = 0; a < kernel; ++a)
            for (int64_t b = 0; b < kernel; ++b)
              best = std::max(best, in[0][(p * x[2] + i * stride + a) * x[3] + j * stride + b]);
          y.push_back(best);
        }
    return y;
  };
  return c;
}

OpCase softmax_ce_case() {
  const int64_t batch = 6, classes = 5;
  OpCase c;
  c.name = "softmax_cross_entropy";
  c.inputs = {{Shape{batch, classes}}, {Shape{batch}, Draw::Labels, classes}};
  c.build = [](GraphBuilder& b, const std::vector<Value>& in) { return b.softmax_cross_entropy(in[0], in[1]); };
  c.reference = [=](const std::vector<Host>& in) {
    double total = 0.0;
    for (int64_t r = 0; r < batch; ++r) {
      double sum = 0.0;
      for (int64_t k = 0; k < classes; ++k) sum += std::exp(in[0][r * classes + k]);
      total += std::log(sum) - in[0][r * classes + static_cast<int64_t>(in[1][r])];
    }
    return Host{total / batch};
  };
  return c;
}

// Naive LSTM over T steps with gates i, f, g, o: the textbook recurrence, step by step.
OpCase lstm_case(int64_t batch, int64_t steps, int64_t input, int64_t hidden) {
  OpCase c;
  c.name = cat("lstm_B", batch, "_T", steps);
  c.inputs = {{Shape{batch, steps, input}}, {Shape{input, 4 * hidden}}, {Shape{hidden, 4 * hidden}},
              {Shape{4 * hidden}}};
  c.build = [](GraphBuilder& b, const std::vector<Value>& in) { return b.lstm(in[0], in[1], in[2], in[3]); };
  c.reference = [=](const std::vector<Host>& in) {
    const Host &x = in[0], &wx = in[1], &wh = in[2], &bias = in[3];
    Host out(batch * steps * hidden);
    for (int64_t b = 0; b < batch; ++b) {
      Host h(hidden, 0.0), cell(hidden, 0.0);
      for (int64_t t = 0; t < steps; ++t) {
        Host pre(4 * hidden);
        for (int64_t j = 0; j < 4 * hidden; ++j) {
          pre[j] = bias[j];
          for (int64_t i = 0; i < input; ++i) pre[j] += x[(b * steps + t) * input + i] * wx[i * 4 * hidden + j];
          for (int64_t k = 0; k < hidden; ++k) pre[j] += h[k] * wh[k * 4 * hidden + j];
        }
        for (int64_t j = 0; j < hidden; ++j) {
          double ig = sigmoid(pre[j]), fg = sigmoid(pre[hidden + j]);
          double gg = std::tanh(pre[2 * hidden + j]), og = sigmoid(pre[3 * hidden + j]);
          cell[j] = fg * cell[j] + ig * gg;
          h[j] = og * std::tanh(cell[j]);
          out[(b * steps + t) * hidden + j] = h[j];
        }
      }
    }
    return out;
  };
  return c;
}

OpCase select_step_case(int64_t step) {
  OpCase c;
  c.name = cat("select_step_", step);
  c.inputs = {{Shape{3, 4, 5}}};
  c.build = [step](GraphBuilder& b, const std::vector<Value>& in) { return b.select_step(in[0], step); };
  c.reference = [step](const std::vector<Host>& in) {
    int64_t t = step < 0 ? step + 4 : step;
    Host out;
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t h = 0; h < 5; ++h) out.push_back(in[0][(b * 4 + t) * 5 + h]);
    return out;
  };
  return c;
}

// The cell's row loops (ops/lstm_cell.cpp, built with -ffast-math) are vectorized by the compiler,
// 8 or 16 hidden units a vector under AVX2 or AVX-512; the other cases' H of 3 and 4 reach only the
// scalar remainder, H = 17 reaches the vector body and its tail.
OpCase lstm_h17() {
  OpCase c = lstm_case(2, 3, 5, 17);
  c.name = "lstm_B2_T3_H17";
  c.epsilon = 3e-3;  // as the random LSTMs: gradients summed over B x T cells
  return c;
}

OpCase reshape_case() {
  OpCase c;
  c.name = "reshape";
  c.inputs = {{Shape{2, 3, 4}}};
  c.build = [](GraphBuilder& b, const std::vector<Value>& in) { return b.reshape(in[0], Shape{4, 6}); };
  c.reference = [](const std::vector<Host>& in) { return in[0]; };
  return c;
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases = {
      matmul_case(false, false), matmul_case(true, false), matmul_case(false, true), matmul_case(true, true),
      binary_case("add", [](double a, double b) { return a + b; }),
      binary_case("mul", [](double a, double b) { return a * b; }),
      unary_case("relu", Draw::AwayFromZero, [](double x) { return x > 0 ? x : 0.0; }),
      unary_case("sigmoid", Draw::Smooth, sigmoid),
      unary_case("tanh", Draw::Smooth, [](double x) { return std::tanh(x); }),
      bias_add_case(Shape{4, 6}), bias_add_case(Shape{2, 3, 4, 5}),
      conv_case(Shape{2, 3, 7, 7}, Shape{4, 3, 3, 3}, 1, 1),
      conv_case(Shape{2, 2, 8, 8}, Shape{3, 2, 3, 3}, 2, 1),  // stride 2 with padding
      conv_case(Shape{1, 1, 6, 6}, Shape{2, 1, 5, 5}, 1, 2),  // the CNN's 5x5, pad 2
      // A rectangular kernel on a rectangular plane, 5 channels at stride 2 (the others are square).
      conv_case(Shape{2, 5, 9, 7}, Shape{6, 5, 2, 3}, 2, 1),
      max_pool_case(Shape{2, 3, 6, 6}, 2, 2), max_pool_case(Shape{1, 2, 7, 7}, 3, 2),
      softmax_ce_case(),
      lstm_case(2, 1, 3, 4), lstm_case(3, 5, 4, 3),  // one step and several steps
      lstm_h17(),  // the cell's vectorized loop and its tail
      select_step_case(-1), select_step_case(1),
      reshape_case(),
  };
  return cases;
}

// STYLE.md: every op's CPU kernels end with the plain reference kernel, the one the others are
// tested against (check_forward and check_gradient run it by name; a name an op lacks would fall
// back to its first kernel, unnoticed).
TEST(Registry, EveryCpuOpEndsWithItsReferenceKernel) {
  for (const std::string& kind : OpRegistry::global().kinds()) {
    std::vector<std::string> cpu;
    for (const KernelImpl& impl : OpRegistry::global().get(kind).kernels)
      if (impl.device == DeviceKind::CPU) cpu.push_back(impl.name);
    if (cpu.empty()) continue;
    EXPECT_EQ(cpu.back(), "reference") << kind;
    EXPECT_EQ(std::count(cpu.begin(), cpu.end(), "reference"), 1) << kind;
  }
}

// oneDNN calls (GEMM, convolution) run at an OpenMP width of one on the thread that makes them,
// and put the thread's own width back afterwards: the calling thread may be an application's.
TEST(OneDnn, CallsLeaveTheCallersOpenMpWidthAsItWas) {
  GraphBuilder b;
  Value x = b.input("x", Shape{2, 1, 8, 8});
  Value y = b.conv2d(x, b.parameter("k", Shape{4, 1, 3, 3}, ParamInit::zeros()), {}, "conv");
  Value z = b.matmul(b.reshape(y, Shape{2, 144}), b.parameter("w", Shape{144, 3}, ParamInit::zeros()), false, false, "fc");
  ParamStore store(b.graph());
  PlanOptions options;
  options.threads = 1;  // the kernels run on this thread
  Plan plan(b.graph(), store, {z}, options);
  const int before = omp_get_max_threads();
  omp_set_num_threads(3);
  plan.run();
  EXPECT_EQ(omp_get_max_threads(), 3);
  omp_set_num_threads(before);
}

// A 3x3 convolution (padding 1, stride 1) of the input "x" (xs) by the input "w" (ws), and its two
// gradients of the input "dy": the three oneDNN passes.
struct ConvPasses {
  ConvPasses(const Shape& xs, const Shape& ws) {
    Value x = b.input("x", xs), w = b.input("w", ws), dy = b.input("dy", Shape{xs[0], ws[0], xs[2], xs[3]});
    y = b.conv2d(x, w, Conv2dAttrs{1, 1}, "conv");
    Attrs input_attrs, weight_attrs;
    input_attrs.set("stride", int64_t{1}).set("padding", int64_t{1}).set("shape", xs.dims());
    weight_attrs.set("stride", int64_t{1}).set("padding", int64_t{1}).set("shape", ws.dims());
    dx = b.apply1("conv2d_grad_input", {dy, w}, input_attrs, "dx");
    dw = b.apply1("conv2d_grad_weight", {dy, x}, weight_attrs, "dw");
  }
  GraphBuilder b;
  Value y, dx, dw;
};

// The oneDNN convolutions cut the batch into one slice per granted thread, and the reordered
// copies of the batch-cut arguments of every slice count share one buffer per argument. Slice
// counts taken in turn must each give the im2col kernels' results: 16 and 32 channels (blocked
// layouts without padding), and a batch of 7 with 3, 5 and 20 channels (slices of uneven size,
// channels padded in the blocked layouts). Each slice count gets new inputs, so one that read
// copies another count left in the shared buffers fails. Each slice's region is rounded up to 64
// bytes: where oneDNN picks 8-channel blocks, a 5x5 image of 20 channels (24 with padding) takes
// 2400 bytes, so 5 slices outgrow what fewer reserved and the counts after them use the grown
// buffer (SharedBuffer::reserve); with 16-channel blocks an image is a multiple of 64 bytes.
TEST(OneDnnConv, SliceCountsInTurnShareTheirCopiesAndAgree) {
  struct Geometry {
    Shape x, w;
  };
  for (const Geometry& geometry : {Geometry{Shape{6, 16, 9, 9}, Shape{32, 16, 3, 3}},
                                   Geometry{Shape{7, 3, 5, 5}, Shape{5, 3, 3, 3}},
                                   Geometry{Shape{7, 20, 6, 6}, Shape{20, 20, 3, 3}},
                                   Geometry{Shape{7, 20, 5, 5}, Shape{20, 20, 3, 3}}}) {
    SCOPED_TRACE(cat("x ", geometry.x.str(), ", w ", geometry.w.str()));
    const ConvPasses passes(geometry.x, geometry.w);
    const GraphBuilder& b = passes.b;
    const Value y = passes.y, dx = passes.dx, dw = passes.dw;
    ParamStore store(b.graph());
    PlanOptions reference_options;
    reference_options.prefer_kernel = "im2col_gemm";
    Plan reference(b.graph(), store, {y, dx, dw}, reference_options);
    Plan onednn(b.graph(), store, {y, dx, dw});
    for (const PlanStep& step : onednn.steps()) EXPECT_EQ(step.kernel_name, "onednn");
    EXPECT_GT(onednn.kernel_bytes(), 0) << "the prepared convolutions hold reordered copies: the plan must count them";
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> draw(-1.0f, 1.0f);
    for (int threads : {1, 3, 2, 1, 3, 5, 2, 1}) {
      SCOPED_TRACE(cat(threads, " slice(s)"));
      for (const char* name : {"x", "w", "dy"}) {
        std::vector<float> values(static_cast<size_t>(onednn.input(name).numel()));
        for (float& v : values) v = draw(rng);
        onednn.upload(onednn.input(name), values.data());
        reference.upload(reference.input(name), values.data());
      }
      reference.run();
      const ThreadBudget budget(threads);
      // Outputs poisoned first: a slice count that left some of them unwritten shows as NaN, not
      // as the last count's values.
      for (Value v : {y, dx, dw}) onednn.tensor(v).fill(std::numeric_limits<float>::quiet_NaN());
      const int64_t run = onednn.begin_run();
      for (int position = 0; position < static_cast<int>(onednn.steps().size()); ++position)
        onednn.run_step(position, budget, run);
      for (Value v : {y, dx, dw}) {
        const Tensor& got = onednn.tensor(v);
        const Tensor& want = reference.tensor(v);
        float worst = 0.0f;
        for (int64_t i = 0; i < got.numel(); ++i) {
          const float error = std::abs(got.f32()[i] - want.f32()[i]) / std::max(1.0f, std::abs(want.f32()[i]));
          if (!(error <= worst)) worst = error;  // a NaN too (std::max would keep `worst`)
        }
        EXPECT_LT(worst, 1e-4f) << b.graph().value(v.id).name;
      }
    }
  }
}

// Every slice count's buffers are regions of the kernel's shared buffers, which preparing the plan
// grows to its widest count: running each count up to the plan's threads then takes little more
// heap (primitives, their JIT code: 1.4 MB here). Before, each count kept its slices' own copies of
// the weights, dw's shares and scratchpads: 44 MB more here, where the plan counted 1.8 MB.
TEST(OneDnnConv, RunningEverySliceCountStaysWithinWhatThePlanCounted) {
  const ConvPasses passes(Shape{8, 64, 6, 6}, Shape{128, 64, 3, 3});
  ParamStore store(passes.b.graph());
  PlanOptions options;
  options.threads = 8;
  Plan plan(passes.b.graph(), store, {passes.y, passes.dx, passes.dw}, options);
  for (const char* name : {"x", "w", "dy"}) plan.input(name).fill(0.5f);
  const auto heap = [] {
    const struct mallinfo2 info = mallinfo2();
    return static_cast<int64_t>(info.uordblks + info.hblkhd);
  };
  const int64_t before = heap();
  for (int threads = 1; threads <= 8; ++threads) {
    const ThreadBudget budget(threads);
    const int64_t run = plan.begin_run();
    for (int position = 0; position < static_cast<int>(plan.steps().size()); ++position)
      plan.run_step(position, budget, run);
  }
  const int64_t grown = heap() - before;
  EXPECT_LT(grown, int64_t{8} << 20) << "the plan counted " << plan.kernel_bytes() << " bytes for its kernels";
}

// The gradient ops' own errors name them: a shape attribute of the wrong rank as the attribute
// (not as an input), and a label out of range as met by softmax_cross_entropy_grad's kernel.
TEST(GradientOps, ErrorsNameTheGradientOpAndWhatIsWrong) {
  GraphBuilder b;
  Attrs pool;
  pool.set("kernel", int64_t{2}).set("shape", std::vector<int64_t>{4, 4});
  std::string message;
  try {
    b.apply1("max_pool2d_grad", {b.input("dy", Shape{2, 2}), b.input("argmax", Shape{2, 2}, DType::I32)}, pool, "pg");
  } catch (const Error& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("max_pool2d_grad 'pg': attribute shape [4,4] must have rank 4"), std::string::npos) << message;
  Value dloss = b.input("dloss", Shape{1});
  Value probs = b.input("probs", Shape{2, 3});
  Value labels = b.input("labels", Shape{2}, DType::I32);
  Value dlogits = b.apply1("softmax_cross_entropy_grad", {dloss, probs, labels}, {}, "ce_grad");
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {dlogits});
  plan.input("dloss").fill(1.0f);
  plan.input("probs").fill(1.0f / 3.0f);
  plan.input("labels").i32()[0] = 1, plan.input("labels").i32()[1] = 3;
  message.clear();
  try {
    plan.run();
  } catch (const Error& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("softmax_cross_entropy_grad 'ce_grad': label 3 at row 1 is outside 0..2"), std::string::npos)
      << message;
}

// max_pool2d_grad scatters dy through argmax; the op is public (apply()), so an argmax outside
// the plane is an error naming the node, not a write out of bounds.
TEST(MaxPoolGrad, AnArgmaxOutsideThePlaneIsRefused) {
  GraphBuilder b;
  Value dy = b.input("dy", Shape{1, 1, 2, 2});
  Value argmax = b.input("argmax", Shape{1, 1, 2, 2}, DType::I32);
  Attrs attrs;
  attrs.set("kernel", int64_t{2}).set("shape", std::vector<int64_t>{1, 1, 4, 4});
  Value dx = b.apply1("max_pool2d_grad", {dy, argmax}, attrs, "scatter");
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {dx});
  std::fill_n(plan.input("dy").f32(), 4, 1.0f);
  const int32_t good[4] = {0, 3, 9, 15}, bad[4] = {0, 3, 99, 15};
  std::copy_n(good, 4, plan.input("argmax").i32());
  plan.run();
  EXPECT_EQ(plan.tensor(dx).f32()[9], 1.0f);
  std::copy_n(bad, 4, plan.input("argmax").i32());
  try {
    plan.run();
    FAIL() << "argmax 99 of a 4x4 plane must be refused";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("'scatter'"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("argmax 99"), std::string::npos) << error.what();
  }
}

// A random max-pool case: x (1-3, 1-4, 1-side, 1-side), a kernel of 1-max_kernel that fits x, a
// stride of 1-max_stride.
struct PoolCase {
  Shape x;
  int64_t kernel = 1, stride = 1;
};
PoolCase random_pool_case(std::mt19937& rng, int64_t side, int64_t max_kernel, int64_t max_stride) {
  auto pick = [&rng](int64_t low, int64_t high) { return low + static_cast<int64_t>(rng() % (high - low + 1)); };
  PoolCase c;
  c.x = Shape{pick(1, 3), pick(1, 4), pick(1, side), pick(1, side)};
  c.kernel = pick(1, std::min(max_kernel, std::min(c.x[2], c.x[3])));
  c.stride = pick(1, max_stride);
  return c;
}

// dx must be the scatter of dy through argmax into zeros, bit for bit (a -0 dy gives +0, as
// 0 + -0 does: kept on purpose, a kernel writing dy directly must add 0 too), every element
// written, over random geometries with overlapping windows, uncovered margins and gaps, at 1 and
// 2 threads; also where an argmax lies inside the plane but outside its window (apply()).
TEST(MaxPoolGrad, EqualsTheScatterOfDyThroughArgmax) {
  std::mt19937 rng(11);
  auto pick = [&rng](int64_t low, int64_t high) { return low + static_cast<int64_t>(rng() % (high - low + 1)); };
  for (int trial = 0; trial < 40; ++trial) {
    const auto [x, kernel, stride] = random_pool_case(rng, 30, 3, 4);
    Attrs attrs;
    attrs.set("kernel", kernel).set("stride", stride).set("shape", x.dims());
    const PoolGeometry g = pool_geometry(x, attrs);
    const Shape pooled_shape{x[0], x[1], g.out_h, g.out_w};
    GraphBuilder b;
    Value dx = b.apply1("max_pool2d_grad", {b.input("dy", pooled_shape), b.input("argmax", pooled_shape, DType::I32)},
                        attrs, "pool_grad");
    ParamStore store(b.graph());
    std::vector<float> dy(pooled_shape.numel());
    for (float& v : dy) v = rng() % 10 == 0 ? -0.0f : static_cast<float>(static_cast<int>(rng() % 7) - 3);
    std::vector<int32_t> argmax(pooled_shape.numel());
    for (int64_t p = 0; p < g.planes; ++p)
      for (int64_t oh = 0; oh < g.out_h; ++oh)
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const int64_t kh = pick(0, kernel - 1), kw = pick(0, kernel - 1);
          int64_t at = (oh * stride + kh) * g.width + ow * stride + kw;
          if (trial % 5 == 4 && rng() % 8 == 0) at = pick(0, g.plane() - 1);  // anywhere in the plane
          argmax[(p * g.out_h + oh) * g.out_w + ow] = static_cast<int32_t>(at);
        }
    std::vector<float> want(x.numel(), 0.0f);
    for (int64_t o = 0; o < pooled_shape.numel(); ++o) want[o / g.out_plane() * g.plane() + argmax[o]] += dy[o];
    for (int threads : {1, 2}) {
      SCOPED_TRACE(cat(x.str(), " kernel ", kernel, " stride ", stride, ", ", threads, " threads"));
      PlanOptions options;
      options.threads = threads;
      Plan plan(b.graph(), store, {dx}, options);
      std::copy(dy.begin(), dy.end(), plan.input("dy").f32());
      std::copy(argmax.begin(), argmax.end(), plan.input("argmax").i32());
      std::fill_n(plan.tensor(dx).f32(), x.numel(), 5.0f);  // every element must be written
      plan.run();
      const float* got = plan.tensor(dx).f32();
      for (int64_t i = 0; i < x.numel(); ++i)
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << "element " << i << ": " << got[i] << " vs " << want[i];
    }
  }
}

// The CPU max_pool2d kernel compares a window's elements output-parallel and without branches;
// it must pick exactly what math::max_pool_argmax (the rule the CUDA kernel and the gradient rely
// on) picks, element for element: on planes full of ties (values from {0, 1, 2}, as ReLU outputs
// tie at 0) and NaNs, over random geometries, at 1 and 2 threads.
TEST(MaxPool, CpuKernelPicksWhatTheArgmaxRulePicks) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const auto [x, kernel, stride] = random_pool_case(rng, 40, 4, 3);
    Attrs attrs;
    attrs.set("kernel", kernel).set("stride", stride);
    GraphBuilder b;
    const std::vector<Value> out = b.apply("max_pool2d", {b.input("x", x)}, attrs, "pool");
    ParamStore store(b.graph());
    std::vector<float> values(x.numel());
    for (float& v : values) v = rng() % 20 == 0 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(rng() % 3);
    const PoolGeometry g = pool_geometry(x, attrs);
    for (int threads : {1, 2}) {
      SCOPED_TRACE(cat(x.str(), " kernel ", kernel, " stride ", stride, ", ", threads, " threads"));
      PlanOptions options;
      options.threads = threads;
      Plan plan(b.graph(), store, out, options);
      std::copy(values.begin(), values.end(), plan.input("x").f32());
      plan.run();
      const float* y = plan.tensor(out[0]).f32();
      const int32_t* argmax = plan.tensor(out[1]).i32();
      for (int64_t p = 0; p < g.planes; ++p)
        for (int64_t oh = 0; oh < g.out_h; ++oh)
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const int64_t o = (p * g.out_h + oh) * g.out_w + ow;
            const int64_t expected = math::max_pool_argmax(values.data() + p * g.plane(), g, oh, ow);
            ASSERT_EQ(argmax[o], expected) << "plane " << p << " output (" << oh << ", " << ow << ")";
            const float want = values[p * g.plane() + expected];
            ASSERT_TRUE(std::isnan(want) ? std::isnan(y[o]) : y[o] == want) << "output " << o;
          }
    }
  }
}

// The cases above are too small for most kernels to split: an elementwise loop's grain is 16384
// elements, a 2-D bias_add's 16384 / C rows, a pool's 8 planes, so their "2 threads" and
// "3 threads" runs were one chunk on one thread. These ranges exceed their grains, so they are
// cut into several chunks (TBB's simple partitioner halves a range while it exceeds the grain:
// 32,800 elements into 4 of 8,200; the pool of the TSAN build takes grain-sized chunks), forward
// on 1 and 2 threads and gradients on 1 and 3, against the reference; a chunk indexed from the
// wrong start fails them.
TEST(Ops, KernelsCutIntoChunksMatchTheReference) {
  auto sampled = [](OpCase c, const std::string& name) {
    c.name = name;
    c.max_checked_elements = 48;  // a seeded sample of each input's gradient, from every chunk alike
    return c;
  };
  auto wide = [&](OpCase c) {
    for (InputSpec& input : c.inputs) input.shape = Shape{2, 16400};
    return sampled(c, c.name + "[2,16400]");
  };
  const std::vector<OpCase> cases = {
      wide(binary_case("add", [](double a, double b) { return a + b; })),  // 32,800 elements
      wide(binary_case("mul", [](double a, double b) { return a * b; })),
      wide(unary_case("relu", Draw::AwayFromZero, [](double x) { return x > 0 ? x : 0.0; })),
      wide(unary_case("sigmoid", Draw::Smooth, sigmoid)),
      sampled(bias_add_case(Shape{1500, 11}), "bias_add[1500,11]"),  // a grain of 1489 rows
      sampled(max_pool_case(Shape{3, 4, 6, 6}, 2, 2), "max_pool2d[3,4,6,6]"),  // 12 planes
      sampled(max_pool_case(Shape{5, 4, 5, 5}, 3, 1), "max_pool2d[5,4,5,5]_k3_s1"),  // overlapping, 20 planes
  };
  for (const OpCase& op_case : cases) {
    SCOPED_TRACE(op_case.name);
    check_forward(op_case);
    check_gradient(op_case);
  }
}

// A GEMM with B transposed, few rows and more than 1024 columns runs as blocks of 1024 columns
// (ops/gemm.cpp: oneDNN's sgemm is 2x slower there in one call), with a tail block; at 2 threads
// the wider product is cut into two column slices (enough work for two: K = 64), and each is
// blocked again.
TEST(Gemm, WideTransposedBIsComputedInBlocks) {
  EXPECT_EQ(gemm_slices(GemmShape{3, 2085, 9}, 2), 1);  // 56k multiply-adds: one slice's worth
  EXPECT_EQ(gemm_slices(GemmShape{3, 2085, 64}, 2), 2);  // 400k: two slices ...
  EXPECT_TRUE(gemm_cuts_columns(GemmShape{3, 2085, 64}, 2));  // ... of columns (3 rows)
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1025, 9}, {2085, 64}}) {
    SCOPED_TRACE(cat("N = ", n, ", K = ", k));
    check_forward(matmul_case(false, true, 3, n, k));
  }
}

// gemm() cuts C by columns where N > M and the rows are too few for 8 per slice, or where B
// outgrows a core's L2 cache (each row slice would stream all of it) and the rows are too few for
// 32 per slice; else by rows. The MLP's fc1 forward at batch 16 (B 784 x 512 floats, 1.53 MiB)
// against L2 caches of 1 and 2 MiB; a 64 MiB B outgrows any L2. Products cut either way (both
// big enough to be cut on 2 threads; the columns' last slice not a multiple of 16) equal the
// reference, B transposed or not (check_forward runs them on 1 and 2 threads).
TEST(Gemm, ColumnsAreCutWhereRowSlicesWouldEachStreamALargeB) {
  auto shape = [](int64_t m, int64_t n, int64_t k) { return GemmShape{m, n, k}; };
  const int64_t mib = int64_t{1} << 20;
  EXPECT_TRUE(gemm_cuts_columns(shape(16, 512, 784), 2, mib));       // B outgrows 1 MiB
  EXPECT_FALSE(gemm_cuts_columns(shape(16, 512, 784), 2, 2 * mib));  // ...and fits in 2 MiB
  EXPECT_TRUE(gemm_cuts_columns(shape(32, 512, 784), 2, mib));       // 16 rows a slice: too few
  EXPECT_FALSE(gemm_cuts_columns(shape(64, 512, 784), 2, mib));      // 32 rows a slice: enough
  EXPECT_TRUE(gemm_cuts_columns(shape(64, 512, 784), 4, mib));
  EXPECT_TRUE(gemm_cuts_columns(shape(4, 512, 32), 2, mib));         // 2 rows a slice, B small
  EXPECT_FALSE(gemm_cuts_columns(shape(16, 512, 32), 2, mib));       // B 64 KiB: rows
  EXPECT_FALSE(gemm_cuts_columns(shape(512, 512, 4096), 2, mib));    // N <= M: rows
  EXPECT_FALSE(gemm_cuts_columns(shape(16, 512, 784), 1, mib));      // one slice: nothing to cut
  EXPECT_TRUE(gemm_cuts_columns(shape(16, 4096, 4096), 2));          // 64 MiB, this machine's L2
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "B transposed" : "B as stored");
    check_forward(matmul_case(false, transposed, 16, 1100, 1100));  // B 4.6 MiB: columns
    check_forward(matmul_case(false, transposed, 16, 512, 64));     // B 128 KiB: rows
  }
  // A transposed (every dW = X^T dY): its row slices are column ranges of the stored A.
  EXPECT_EQ(gemm_slices(GemmShape{256, 64, 128, true, false}, 2), 2);
  EXPECT_FALSE(gemm_cuts_columns(GemmShape{256, 64, 128, true, false}, 2));
  for (bool transposed : {false, true}) check_forward(matmul_case(true, transposed, 256, 64, 128));
}

// The kinks the finite-difference cases stay away from, through the graph and autodiff: the
// gradient of sum(op(x) * r) with respect to x, for chosen x.
std::vector<float> gradient_at(const std::function<Value(GraphBuilder&, Value)>& op, const Shape& shape,
                               const std::vector<float>& x) {
  GraphBuilder b;
  Value in = b.parameter("x", shape, ParamInit::zeros());
  Value y = op(b, in);
  const int64_t count = b.shape(y).numel();
  Value r = b.input("r", Shape{count, 1});
  build_backward(b, b.reshape(b.matmul(b.reshape(y, Shape{1, count}), r), Shape{}));
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {Value{b.graph().params()[0].grad}});
  std::copy(x.begin(), x.end(), store.param(0).f32());
  for (int64_t k = 0; k < count; ++k) plan.input("r").f32()[k] = static_cast<float>(k + 2);  // r = 2, 3, 4, ...
  plan.run();
  const float* dx = store.flat_grads().f32() + store.slots()[0].offset;  // the flat buffer is padded
  return std::vector<float>(dx, dx + shape.numel());
}

TEST(Kinks, ReluPassesNoGradientAtZero) {
  const std::vector<float> dx =
      gradient_at([](GraphBuilder& b, Value x) { return b.relu(x); }, Shape{1, 4}, {0.0f, -0.0f, 1.0f, -1.0f});
  EXPECT_EQ(dx, (std::vector<float>{0.0f, 0.0f, 4.0f, 0.0f}));
}

TEST(Kinks, MaxPoolTiesSendTheGradientToTheFirstMaximum) {
  // All equal: each 2x2 window's gradient goes to its first element in row-major order.
  std::vector<float> dx = gradient_at([](GraphBuilder& b, Value x) { return b.max_pool2d(x, 2, 2); },
                                      Shape{1, 1, 4, 4}, std::vector<float>(16, 1.0f));
  EXPECT_EQ(dx, (std::vector<float>{2, 0, 3, 0, 0, 0, 0, 0, 4, 0, 5, 0, 0, 0, 0, 0}));
  // 7x7 with 2x2 windows of stride 2: row 6 and column 6 are in no window and get no gradient.
  std::vector<float> x(49);
  for (size_t k = 0; k < x.size(); ++k) x[k] = static_cast<float>(k);  // each window's maximum: bottom right
  dx = gradient_at([](GraphBuilder& b, Value in) { return b.max_pool2d(in, 2, 2); }, Shape{1, 1, 7, 7}, x);
  float total = 0.0f;
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t j = 0; j < 7; ++j) {
      const float expected = (i % 2 == 1 && j % 2 == 1 && i < 6 && j < 6) ? static_cast<float>(2 + (i / 2) * 3 + j / 2) : 0.0f;
      EXPECT_EQ(dx[i * 7 + j], expected) << "dx[" << i << "][" << j << "]";
      total += dx[i * 7 + j];
    }
  EXPECT_EQ(total, 2.0f + 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10);
}

// Every registered op kind is run by a case here (forward or its backward), or by the optimizer's
// own closed-form tests (test_optimizer.cpp): a new op without a test fails here.
// One op's output for given inputs, through a plan of `threads` threads (the release build's kernels,
// vectorized as they train).
std::vector<float> run_op(const std::function<Value(GraphBuilder&, const std::vector<Value>&)>& build,
                          const std::vector<std::pair<Shape, std::vector<float>>>& inputs, DType last = DType::F32) {
  GraphBuilder b;
  std::vector<Value> values;
  for (size_t i = 0; i < inputs.size(); ++i)
    values.push_back(b.input(cat("in", i), inputs[i].first, i + 1 == inputs.size() ? last : DType::F32));
  Value out = build(b, values);
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {out});
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& in = plan.input(cat("in", i));
    for (size_t e = 0; e < inputs[i].second.size(); ++e) {
      if (in.dtype() == DType::I32)
        in.i32()[e] = static_cast<int32_t>(inputs[i].second[e]);
      else
        in.f32()[e] = inputs[i].second[e];
    }
  }
  plan.run();
  const Tensor& result = plan.tensor(out);
  return std::vector<float>(result.f32(), result.f32() + result.numel());
}

// Gates far into saturation: every unit of a 16-wide layer (the vectorized lanes) has its input
// gate at -100 and its output gate at +100. The input gate is (all but) 0, so c and h are too
// (once NaN in the release build, whose cell loop divides through a reciprocal estimate), and the
// forget gate at -100 passes nothing of c.
TEST(Extremes, LstmGatesSaturateToZeroNotNan) {
  const int64_t H = 16;
  std::vector<float> wx(4 * H, 0.0f), wh(H * 4 * H, 0.0f), bias(4 * H, 0.0f);
  for (int64_t j = 0; j < H; ++j) {
    bias[j] = -100.0f;            // i
    bias[H + j] = j % 2 ? -100.0f : 100.0f;  // f
    bias[2 * H + j] = 100.0f;     // g
    bias[3 * H + j] = 100.0f;     // o
  }
  const std::vector<float> h = run_op(
      [](GraphBuilder& b, const std::vector<Value>& in) { return b.lstm(in[0], in[1], in[2], in[3]); },
      {{Shape{1, 2, 1}, {1.0f, -1.0f}}, {Shape{1, 4 * H}, wx}, {Shape{H, 4 * H}, wh}, {Shape{4 * H}, bias}});
  ASSERT_EQ(h.size(), static_cast<size_t>(2 * H));
  for (size_t j = 0; j < h.size(); ++j) EXPECT_NEAR(h[j], 0.0f, 1e-30f) << "h[" << j << "]";  // the gate is 1.8e-35
}

// The loss of a row of equal logits is log(C) however large they are: log(sum) was once added
// to the 1e20 first and lost.
TEST(Extremes, CrossEntropyOfHugeEqualLogitsIsLogC) {
  for (float logit : {1e20f, -1e30f, 1e30f, 0.0f}) {
    const std::vector<float> loss = run_op(
        [](GraphBuilder& b, const std::vector<Value>& in) { return b.softmax_cross_entropy(in[0], in[1]); },
        {{Shape{2, 4}, std::vector<float>(8, logit)}, {Shape{2}, {0.0f, 3.0f}}}, DType::I32);
    ASSERT_EQ(loss.size(), 1u);
    EXPECT_NEAR(loss[0], std::log(4.0), 1e-6) << logit;
  }
}

// A large plane of one sign: bias_grad over (B, C, H, W) sums each plane in float lanes, added
// into a double often enough that it matches the double sum as the (B, C) path and CUDA do (with
// 4096 floats a lane, as a 256 x 256 plane once took, 6553.85 where the sum is 6553.60).
TEST(Extremes, BiasGradOfALargePlaneSumsAsInDouble) {
  const int64_t plane = 256 * 256;
  const std::vector<float> dbias = run_op(
      [](GraphBuilder& b, const std::vector<Value>& in) { return b.apply1("bias_grad", {in[0]}); },
      {{Shape{1, 2, 256, 256}, std::vector<float>(2 * plane, 0.1f)}});
  ASSERT_EQ(dbias.size(), 2u);
  const double exact = static_cast<double>(plane) * static_cast<double>(0.1f);
  for (float sum : dbias) EXPECT_NEAR(sum, exact, 1e-6 * exact);
}

TEST(OpCases, RunEveryRegisteredKind) {
  std::set<std::string> covered = {"sgd_update", "adam_update"};  // tests/ops/test_optimizer.cpp
  for (const OpCase& op_case : all_cases())
    for (const std::string& kind : op_kinds_of(op_case)) covered.insert(kind);
  const std::vector<std::string> kinds = OpRegistry::global().kinds();
  ASSERT_GT(kinds.size(), 20u) << "the registry looks empty";
  for (const std::string& kind : kinds)
    EXPECT_TRUE(covered.count(kind)) << "op kind '" << kind << "' is registered but no case in tests/ops/test_ops.cpp runs it";
}

// Convolution and pooling over seeded random geometries (rectangular planes, strides 1-3,
// padding 0-2, odd sizes that leave rows and columns out), GEMMs of odd sizes with every
// transpose, and LSTMs of random sizes: the same forward and gradient checks, so an edge case the
// fixed cases miss (a last partial window, a padded border, a GEMM tail) is found here.
TEST(OpCases, RandomGeometriesMatchTheirReferences) {
  std::mt19937 rng(2024);
  auto pick = [&rng](int64_t low, int64_t high) { return low + static_cast<int64_t>(rng() % (high - low + 1)); };
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t height = pick(3, 11), width = pick(3, 11), padding = pick(0, 2), stride = pick(1, 3);
    const int64_t kernel = pick(1, std::min<int64_t>(5, std::min(height, width) + 2 * padding));
    const int64_t channels = pick(1, 4);
    const OpCase conv = conv_case(Shape{pick(1, 3), channels, height, width},
                                  Shape{pick(1, 5), channels, kernel, kernel}, stride, padding);
    SCOPED_TRACE(conv.name);
    check_forward(conv);
    check_gradient(conv);
    const int64_t window = pick(1, std::min<int64_t>(3, std::min(height, width)));
    const OpCase pool = max_pool_case(Shape{pick(1, 2), pick(1, 3), height, width}, window, pick(1, 3));
    SCOPED_TRACE(pool.name);
    check_forward(pool);
    check_gradient(pool);
    const OpCase matmul = matmul_case(rng() % 2, rng() % 2, pick(1, 33), pick(1, 33), pick(1, 33));
    SCOPED_TRACE(matmul.name);
    check_forward(matmul);
    check_gradient(matmul);
    if (trial % 3 == 0) {
      OpCase lstm = lstm_case(pick(1, 4), pick(1, 6), pick(1, 7), pick(1, 9));
      lstm.epsilon = 3e-3;  // its gradients sum over B x T cells: at 1e-2 the differences' own error reached 5e-4
      SCOPED_TRACE(cat(lstm.name, " ", lstm.inputs[0].shape.str(), " ", lstm.inputs[2].shape.str()));
      check_forward(lstm);
      check_gradient(lstm);
    }
  }
}

class OpTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpTest, ForwardMatchesReference) { check_forward(GetParam()); }
TEST_P(OpTest, GradientMatchesFiniteDifferences) { check_gradient(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Ops, OpTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           std::string name;
                           for (char ch : info.param.name) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return name;
                         });

}  // namespace
}  // namespace quiver::testing
