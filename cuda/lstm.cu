// CUDA kernels for lstm and lstm_grad, with the layouts of ops/lstm.cpp: x (B, T, I), wx (I, 4H),
// wh (H, 4H), b (4H) -> h (B, T, H) and a cache (T, B, 5H) holding i, f, g, o and c per step.
// GEMMs go through cuBLAS on the call's stream; the cell math of each step is one kernel calling
// the shared QUIVER_HD functions of ops/lstm.h. Scratch comes from the stream's workspace.
// Everything is row-major as on the CPU; cuBLAS is column-major, and a row-major matrix is its
// transpose in column-major, so row-major C = op(A) * op(B) is computed as C^T = op(B)^T * op(A)^T.
#include <algorithm>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/gemm.h"
#include "ops/lstm.h"

namespace quiver::cuda {

namespace {

// c (M, N) <- alpha * op(a) * op(b) + beta * c, row-major, with GemmShape's meaning (ops/gemm.h).
void cublas_gemm(const StreamContext& stream, float* c, const float* a, const float* b,
                 const GemmShape& s) {
  // Leading dimensions of the row-major operands as stored (dense unless given); cuBLAS wants
  // at least 1 even where an extent is 0.
  int64_t lda = std::max<int64_t>(1, s.lda >= 0 ? s.lda : (s.trans_a ? s.m : s.k));
  int64_t ldb = std::max<int64_t>(1, s.ldb >= 0 ? s.ldb : (s.trans_b ? s.k : s.n));
  int64_t ldc = std::max<int64_t>(1, s.ldc >= 0 ? s.ldc : s.n);
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {  // an empty sum (cuBLAS may leave C untouched): C = beta * C, beta 0 or 1 here
    if (s.beta == 0.0f)
      QUIVER_CUDA_CHECK(cudaMemset2DAsync(c, static_cast<size_t>(ldc) * sizeof(float), 0,
                                          static_cast<size_t>(s.n) * sizeof(float), static_cast<size_t>(s.m),
                                          stream.stream()));
    return;
  }
  // Column-major: C^T (N, M) = op(B)^T (N, K) * op(A)^T (K, M). A stored row-major is already
  // its transpose to cuBLAS, so each operand keeps its own transpose flag.
  QUIVER_CUBLAS_CHECK(cublas_api().sgemm_64(stream.cublas(), s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, s.n, s.m, s.k, &s.alpha,
                                            b, ldb, a, lda, &s.beta, c, ldc));
}

struct LstmGeometry {
  int64_t batch = 0, steps = 0, input = 0, hidden = 0;
  int64_t gates() const { return 4 * hidden; }
};

LstmGeometry lstm_geometry(const Shape& x, const Shape& wh) { return {x[0], x[1], x[2], wh[0]}; }

// Floats from `offset` rounded up so that every piece of scratch starts 256-byte aligned.
int64_t aligned(int64_t floats) { return (floats + 63) / 64 * 64; }

// Step t of the forward pass for every (b, j) of (B, H): `pre` already holds x*wx plus, for t > 0,
// h(t-1)*wh; the bias is added here.
__global__ void lstm_forward_step_kernel(float* h, float* cache, const float* pre,
                                         const float* bias, int64_t t, int64_t batch,
                                         int64_t steps, int64_t hidden) {
  const int64_t count = batch * hidden, H = hidden, G = 4 * hidden;
  for (int64_t k = first_index(); k < count; k += grid_stride()) {
    int64_t b = k / H, j = k - b * H;
    const float* gates = pre + (b * steps + t) * G;  // (4H)
    float c_prev = t > 0 ? cache[((t - 1) * batch + b) * 5 * H + 4 * H + j] : 0.0f;
    math::LstmCell cell = math::lstm_cell_forward(gates[j] + bias[j], gates[H + j] + bias[H + j],
                                                  gates[2 * H + j] + bias[2 * H + j],
                                                  gates[3 * H + j] + bias[3 * H + j], c_prev);
    float* out = cache + (t * batch + b) * 5 * H;  // (5H)
    out[j] = cell.i;
    out[H + j] = cell.f;
    out[2 * H + j] = cell.g;
    out[3 * H + j] = cell.o;
    out[4 * H + j] = cell.c;
    h[(b * steps + t) * H + j] = cell.h;
  }
}

// Step t of backpropagation through time for every (b, j) of (B, H): dh(t) is the output
// gradient plus the carry from step t+1 (dh_next); dc_next is read and replaced by dc(t-1).
__global__ void lstm_backward_step_kernel(float* dgates, float* dc_next, const float* dh_next,
                                          const float* dh, const float* cache, int64_t t,
                                          int64_t batch, int64_t steps, int64_t hidden) {
  const int64_t count = batch * hidden, H = hidden, G = 4 * hidden;
  for (int64_t k = first_index(); k < count; k += grid_stride()) {
    int64_t b = k / H, j = k - b * H;
    const float* cell = cache + (t * batch + b) * 5 * H;  // (5H)
    float c_prev = t > 0 ? cache[((t - 1) * batch + b) * 5 * H + 4 * H + j] : 0.0f;
    math::LstmCellGrad grad = math::lstm_cell_backward(
        cell[j], cell[H + j], cell[2 * H + j], cell[3 * H + j], cell[4 * H + j], c_prev,
        dh[(b * steps + t) * H + j] + dh_next[k], dc_next[k]);
    float* row = dgates + (b * steps + t) * G;  // (4H)
    row[j] = grad.d_pre_i;
    row[H + j] = grad.d_pre_f;
    row[2 * H + j] = grad.d_pre_g;
    row[3 * H + j] = grad.d_pre_o;
    dc_next[k] = grad.dc_prev;
  }
}

// h_previous (B, T, H): h shifted one step later, zero at t = 0.
__global__ void shift_steps_kernel(float* h_previous, const float* h, int64_t count, int64_t steps,
                                   int64_t hidden) {
  for (int64_t k = first_index(); k < count; k += grid_stride()) {
    int64_t t = (k / hidden) % steps;
    h_previous[k] = t > 0 ? h[k - hidden] : 0.0f;
  }
}

// dbias[k] = the sum of column k of dgates (rows, 4H): one thread per column, adding rows in
// order and in double as the CPU kernels do (B x T rows of one sign drift in float); neighbouring
// threads read neighbouring columns.
__global__ void column_sum_kernel(float* sums, const float* matrix, int64_t rows, int64_t columns) {
  for (int64_t k = first_index(); k < columns; k += grid_stride()) {
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) sum += matrix[r * columns + k];
    sums[k] = static_cast<float>(sum);
  }
}

KernelFn prepare_lstm_forward(const KernelSpec& spec) {
  LstmGeometry g = lstm_geometry(spec.input(0).shape, spec.input(2).shape);
  const int64_t pre_bytes = static_cast<int64_t>(sizeof(float)) * g.batch * g.steps * g.gates();
  spec.workspace_bytes = pre_bytes;
  return [g, pre_bytes](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    float* h = call.outputs[0].f32();          // (B, T, H)
    float* cache = call.outputs[1].f32();      // (T, B, 5H)
    const float* x = call.inputs[0].f32();     // (B, T, I)
    const float* wx = call.inputs[1].f32();    // (I, 4H)
    const float* wh = call.inputs[2].f32();    // (H, 4H)
    const float* bias = call.inputs[3].f32();  // (4H)
    const int64_t H = g.hidden, G = g.gates(), T = g.steps, cells = g.batch * H;
    if (g.batch * T * G == 0) return;
    // (B*T, 4H): x*wx for all steps at once; step t then adds h(t-1)*wh into its rows.
    auto* pre = static_cast<float*>(stream.workspace(pre_bytes));
    cublas_gemm(stream, pre, x, wx, GemmShape{g.batch * T, G, g.input});
    for (int64_t t = 0; t < T; ++t) {
      if (t > 0) {
        GemmShape s{g.batch, G, H};
        s.beta = 1.0f;
        s.lda = T * H;
        s.ldc = T * G;
        cublas_gemm(stream, pre + t * G, h + (t - 1) * H, wh, s);
      }
      lstm_forward_step_kernel<<<blocks_for(cells), kThreadsPerBlock, 0, stream.stream()>>>(
          h, cache, pre, bias, t, g.batch, T, H);
      QUIVER_CUDA_CHECK_LAUNCH();
    }
  };
}

KernelFn prepare_lstm_backward(const KernelSpec& spec) {
  // inputs: dh (B,T,H), x (B,T,I), wx (I,4H), wh (H,4H), h (B,T,H), cache (T,B,5H)
  // outputs: dx (B,T,I), dwx (I,4H), dwh (H,4H), dbias (4H)
  LstmGeometry g = lstm_geometry(spec.input(1).shape, spec.input(3).shape);
  const bool input_grad = spec.node.attrs.get_int("input_grad", 1) != 0;
  // Scratch: dgates (B*T, 4H), h_previous (B*T, H), and the carries dh_next, dc_next (B, H).
  const int64_t rows = g.batch * g.steps, cells = g.batch * g.hidden;
  const int64_t dgates_size = aligned(rows * g.gates()), h_previous_size = aligned(rows * g.hidden);
  const int64_t scratch_bytes = static_cast<int64_t>(sizeof(float)) * (dgates_size + h_previous_size + 2 * cells);
  spec.workspace_bytes = scratch_bytes;
  return [g, input_grad, rows, cells, dgates_size, h_previous_size, scratch_bytes](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
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
    auto* scratch = static_cast<float*>(stream.workspace(scratch_bytes));
    float* dG = scratch;
    float* h_previous = dG + dgates_size;
    float* dh_next = h_previous + h_previous_size;
    float* dc_next = dh_next + cells;
    if (cells > 0)
      QUIVER_CUDA_CHECK(cudaMemsetAsync(dh_next, 0, sizeof(float) * 2 * static_cast<size_t>(cells),
                                        stream.stream()));

    for (int64_t t = T - 1; t >= 0; --t) {
      lstm_backward_step_kernel<<<blocks_for(cells), kThreadsPerBlock, 0, stream.stream()>>>(
          dG, dc_next, dh_next, dh, cache, t, g.batch, T, H);
      QUIVER_CUDA_CHECK_LAUNCH();
      if (t > 0) {
        // dh_next (B, H) = dgates(t) (B, 4H) * wh^T
        GemmShape s{g.batch, H, G, false, true};
        s.lda = T * G;
        cublas_gemm(stream, dh_next, dG + t * G, wh, s);
      }
    }
    shift_steps_kernel<<<blocks_for(rows * H), kThreadsPerBlock, 0, stream.stream()>>>(
        h_previous, h, rows * H, T, H);
    QUIVER_CUDA_CHECK_LAUNCH();
    cublas_gemm(stream, dwx, x, dG, GemmShape{g.input, G, rows, true, false});
    cublas_gemm(stream, dwh, h_previous, dG, GemmShape{H, G, rows, true, false});
    if (input_grad)
      cublas_gemm(stream, dx, dG, wx, GemmShape{rows, g.input, G, false, true});
    else if (rows * g.input > 0)
      QUIVER_CUDA_CHECK(cudaMemsetAsync(dx, 0, sizeof(float) * static_cast<size_t>(rows * g.input),
                                        stream.stream()));
    column_sum_kernel<<<blocks_for(G), kThreadsPerBlock, 0, stream.stream()>>>(dbias, dG, rows, G);
    QUIVER_CUDA_CHECK_LAUNCH();
  };
}

const bool lstm_kernels_registered = [] {
  OpRegistry& registry = OpRegistry::global();
  registry.add_kernel("lstm", cuda_kernel("cuda", prepare_lstm_forward));
  registry.add_kernel("lstm_grad", cuda_kernel("cuda", prepare_lstm_backward));
  return true;
}();

}  // namespace

}  // namespace quiver::cuda
