// The CUDA kernel of matmul: one cuBLAS sgemm on the call's stream. Quiver's tensors are
// row-major and cuBLAS is column-major, so C (M,N) = op(A) op(B) is computed as its column-major
// transpose C^T (N,M) = op(B)^T op(A)^T: the operands swap places, each keeps its own transpose
// flag, and no data moves. The handle's math mode is left alone (cuBLAS's default: full FP32, no
// TF32), so results match the CPU GEMM to float rounding.
#include <cstdint>

#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/gemm.h"

namespace quiver::cuda {

namespace {

// As ops/matmul.cpp: a (M,K) or (K,M) with trans_a, b (K,N) or (N,K) with trans_b.
GemmShape matmul_shape(const KernelSpec& spec) {
  const Shape& a = spec.input(0).shape;
  const Shape& b = spec.input(1).shape;
  GemmShape s;
  s.trans_a = spec.node.attrs.get_int("trans_a", 0) != 0;
  s.trans_b = spec.node.attrs.get_int("trans_b", 0) != 0;
  s.m = s.trans_a ? a[1] : a[0];
  s.k = s.trans_a ? a[0] : a[1];
  s.n = s.trans_b ? b[0] : b[1];
  s.lda = s.trans_a ? s.m : s.k;  // row length of a as stored
  s.ldb = s.trans_b ? s.k : s.n;
  s.ldc = s.n;
  return s;
}

KernelFn prepare(const KernelSpec& spec) {
  GemmShape s = matmul_shape(spec);
  return [s](const KernelCall& call) {
    const StreamContext& stream = stream_of(call);
    float* c = call.outputs[0].f32();        // (M, N)
    const float* a = call.inputs[0].f32();   // (M, K), or (K, M) with trans_a
    const float* b = call.inputs[1].f32();   // (K, N), or (N, K) with trans_b
    if (s.m == 0 || s.n == 0) return;
    if (s.k == 0) {  // an empty sum: C is zero (cuBLAS may leave C untouched for K = 0)
      QUIVER_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<size_t>(s.m * s.n) * sizeof(float), stream.stream()));
      return;
    }
    const float alpha = 1.0f, beta = 0.0f;
    // 64-bit sizes: no int overflow on large operands.
    QUIVER_CUBLAS_CHECK(cublas_api().sgemm_64(stream.cublas(), s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                              s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, s.n, s.m, s.k, &alpha,
                                              b, s.ldb, a, s.lda, &beta, c, s.ldc));
  };
}

const bool matmul_kernels_registered = [] {
  OpRegistry::global().add_kernel("matmul", cuda_kernel("cublas", prepare));
  return true;
}();

}  // namespace

}  // namespace quiver::cuda
