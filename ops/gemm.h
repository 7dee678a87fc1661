// Single-precision GEMM that honours the caller's thread grant: C (M,N) = alpha*op(A)*op(B) +
// beta*C, row-major. The work is cut into at most ctx.threads() slices of M or of N
// (gemm_cuts_columns), and each slice is one single-threaded oneDNN sgemm call, so oneDNN's
// OpenMP runtime never opens a parallel region of its own: no oversubscription, no idle OpenMP
// threads spinning on cores that other ops were granted.
#pragma once

#include <cstdint>

#include "core/op.h"

namespace quiver {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  int64_t lda = -1, ldb = -1, ldc = -1;  // -1: dense (the natural leading dimension)
};

// c (M, N) <- alpha * op(a) * op(b) + beta * c
void gemm(float* c, const float* a, const float* b, GemmShape shape, const ExecContext& ctx);
// How many slices gemm() cuts C into on `threads` threads: one per 32k multiply-adds at most.
int64_t gemm_slices(GemmShape shape, int64_t threads);
// How gemm() cuts C among `slices` threads: by columns where N > M and either there are too few
// rows for 8 per slice, or B is larger than `l2_bytes` (by default this machine's L2 cache per
// core) and there are too few rows for 32 per slice; else by rows.
bool gemm_cuts_columns(GemmShape shape, int64_t slices, int64_t l2_bytes);
bool gemm_cuts_columns(GemmShape shape, int64_t slices);
// The same with naive loops: the reference the tests compare against.
void gemm_reference(float* c, const float* a, const float* b, GemmShape shape);

}  // namespace quiver
