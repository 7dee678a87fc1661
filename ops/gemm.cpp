#include "ops/gemm.h"

#include <unistd.h>

#include <algorithm>

#include "core/error.h"
#include "ops/onednn_threads.h"
#include "oneapi/dnnl/dnnl.h"

namespace quiver {

namespace {

void fill_leading_dims(GemmShape& s) {
  if (s.lda < 0) s.lda = s.trans_a ? s.m : s.k;
  if (s.ldb < 0) s.ldb = s.trans_b ? s.k : s.n;
  if (s.ldc < 0) s.ldc = s.n;
}

void sgemm_call(float* c, const float* a, const float* b, const GemmShape& s) {
  dnnl_status_t status =
      dnnl_sgemm(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.m, s.n, s.k, s.alpha, a, s.lda,
                 b, s.ldb, s.beta, c, s.ldc);
  if (status != dnnl_success)
    throw Error(cat("oneDNN sgemm failed (status ", static_cast<int>(status), ") for M=", s.m,
                    " N=", s.n, " K=", s.k));
}

// oneDNN 2.6's sgemm falls off a cliff when B is transposed, M is small and N passes about 1100:
// M=16, K=128 took 28.6 us at N=1040 and 68.1 us at N=1200, against 34.0 us for the same N=1200
// in blocks of 1024 (one thread, a throwaway measurement program; the CNN's fc1 input gradient,
// M=16, N=1568, K=128, went from 97-128 us to 60 us). Up to M=64 the blocks won 1.4-2x; at M=256
// they neither won nor lost, so they stop there.
constexpr int64_t kWideTransposedB = 1024, kSmallM = 128;

void sgemm_single_thread(float* c, const float* a, const float* b, const GemmShape& s) {
  const OneDnnOnThisThread one_thread;
  if (!s.trans_b || s.n <= kWideTransposedB || s.m > kSmallM) {
    sgemm_call(c, a, b, s);
    return;
  }
  for (int64_t first = 0; first < s.n; first += kWideTransposedB) {
    GemmShape block = s;
    block.n = std::min(kWideTransposedB, s.n - first);
    sgemm_call(c + first, a, b + first * s.ldb, block);
  }
}

// Below this many multiply-adds a slice is not worth a thread.
constexpr int64_t kMinWorkPerSlice = 32 * 1024;

// One core's L2 cache in bytes as glibc reports it (1 MiB where it does not). glibc gives the
// size of one L2 instance, which some CPUs share among cores (Intel's E-core clusters) or SMT
// siblings: there B may stream from L2 at a smaller size than this says. The threshold was
// measured on one host (AMD EPYC, 1 MiB per core; docs/benchmarks.md).
int64_t l2_bytes_per_core() {
  static const int64_t bytes = [] {
    long reported = 0;
#ifdef _SC_LEVEL2_CACHE_SIZE
    reported = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return reported > 0 ? static_cast<int64_t>(reported) : int64_t{1} << 20;
  }();
  return bytes;
}

}  // namespace

int64_t gemm_slices(GemmShape s, int64_t threads) {
  const int64_t work = s.m * s.n * std::max<int64_t>(1, s.k);
  return std::min<int64_t>(threads, std::max<int64_t>(1, work / kMinWorkPerSlice));
}

bool gemm_cuts_columns(GemmShape s, int64_t slices) { return gemm_cuts_columns(s, slices, l2_bytes_per_core()); }

bool gemm_cuts_columns(GemmShape s, int64_t slices, int64_t l2_bytes) {
  if (slices <= 1 || s.n <= s.m) return false;
  // Each slice of rows streams all of B, each slice of columns only its share. Where every row
  // slice gets 8 rows or more, sgemm runs row slices as fast as the narrower column slices, unless
  // B outgrows a core's L2 cache and the slices have too few rows (under 32) to hide streaming it.
  // The MLP's fc1 forward at batch 16 (M x N x K = 16 x 512 x 784, B 1.6 MB) cut by columns: its
  // step on 2 threads 0.35 ms instead of 0.44, training 1.1-1.2x faster; at batch 256 columns
  // lost (0.93x). docs/benchmarks.md, "GEMM: cut by rows or by columns".
  const bool b_outgrows_l2 = s.k * s.n * static_cast<int64_t>(sizeof(float)) > l2_bytes;
  return s.m < 8 * slices || (b_outgrows_l2 && s.m < 32 * slices);
}

void gemm(float* c, const float* a, const float* b, GemmShape s, const ExecContext& ctx) {
  fill_leading_dims(s);
  if (s.m == 0 || s.n == 0) return;
  int64_t slices = gemm_slices(s, ctx.threads());
  if (slices <= 1) {
    sgemm_single_thread(c, a, b, s);
    return;
  }
  // Rows, or columns in multiples of 16 (the vector width): gemm_cuts_columns().
  const bool split_rows = !gemm_cuts_columns(s, slices);
  int64_t extent = split_rows ? s.m : s.n;
  int64_t unit = split_rows ? 1 : 16;
  int64_t units = (extent + unit - 1) / unit;
  slices = std::min(slices, units);
  ctx.parallel_for(slices, 1, [&](int64_t first, int64_t last) {
    for (int64_t slice = first; slice < last; ++slice) {
      int64_t begin = std::min(extent, units * slice / slices * unit);
      int64_t end = std::min(extent, units * (slice + 1) / slices * unit);
      if (begin >= end) continue;
      GemmShape part = s;
      if (split_rows) {
        part.m = end - begin;
        sgemm_single_thread(c + begin * s.ldc, a + (s.trans_a ? begin : begin * s.lda), b, part);
      } else {
        part.n = end - begin;
        sgemm_single_thread(c + begin, a, b + (s.trans_b ? begin * s.ldb : begin), part);
      }
    }
  });
}

void gemm_reference(float* c, const float* a, const float* b, GemmShape s) {
  fill_leading_dims(s);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < s.k; ++p) {
        float av = s.trans_a ? a[p * s.lda + i] : a[i * s.lda + p];
        float bv = s.trans_b ? b[j * s.ldb + p] : b[p * s.ldb + j];
        sum += static_cast<double>(av) * bv;
      }
      float& out = c[i * s.ldc + j];
      out = static_cast<float>(s.alpha * sum + (s.beta == 0.0f ? 0.0 : s.beta * out));
    }
}

}  // namespace quiver
