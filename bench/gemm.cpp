// quiver-bench-gemm: the measurements behind Quiver's GEMM choices. For the GEMM shapes of the
// bundled models (forward and weight-gradient products at batch 16, 64, 256) it times one thread
// of oneDNN's sgemm (what ops/gemm.cpp calls on each slice) against Eigen's single-threaded
// matrix product, and prints GFLOP/s and the ratio; then, on 2 threads, the same products cut by
// rows and by columns (ops/gemm.cpp's gemm_cuts_columns picks one). Medians of several repeats.
// Before each 2-thread call both threads overwrite a buffer larger than their L2, as a training
// step's other ops do, so B is read from where training finds it.
#include <Eigen/Core>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/op.h"
#include "oneapi/dnnl/dnnl.h"
#include "ops/gemm.h"
#include "runtime/thread_budget.h"

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One untimed call first (oneDNN's JIT and the caches warm up there), then the median of
// `repeats` timed calls.
template <typename Fn>
double median_seconds(Fn fn, int repeats) {
  fn();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  const size_t middle = times.size() / 2;  // of an even count, the mean of the middle two
  return times.size() % 2 ? times[middle] : 0.5 * (times[middle - 1] + times[middle]);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::puts("usage: quiver-bench-gemm\n"
                "One thread of oneDNN's sgemm against Eigen's matrix product on the bundled models'\n"
                "GEMM shapes at batch 16, 64 and 256: GFLOP/s and the ratio (a markdown table);\n"
                "then the same products on 2 threads cut by rows and by columns, and the cut\n"
                "Quiver's gemm() makes.\n"
                "It takes no options.");
      return 0;
    }
    std::fprintf(stderr, "quiver-bench-gemm: unknown option '%s' (it takes none; see --help)\n", argv[i]);
    return 2;
  }
  omp_set_num_threads(1);
  Eigen::setNbThreads(1);
  struct Case { const char* what; int m, n, k; };
  std::vector<Case> cases;
  for (int batch : {16, 64, 256}) {
    cases.push_back({"mlp fc1 forward", batch, 512, 784});
    cases.push_back({"mlp fc1 weight grad", 784, 512, batch});
    cases.push_back({"mlp fc2 forward", batch, 256, 512});
    cases.push_back({"lstm input projection", batch * 28, 512, 28});
    cases.push_back({"lstm recurrent step", batch, 512, 128});
    cases.push_back({"cnn fc1 forward", batch, 128, 1568});
  }
  std::printf("| GEMM (M x N x K) | oneDNN sgemm GFLOP/s | Eigen GFLOP/s | oneDNN / Eigen |\n|---|---|---|---|\n");
  for (const Case& c : cases) {
    RowMatrix a = RowMatrix::Random(c.m, c.k), b = RowMatrix::Random(c.k, c.n), out(c.m, c.n);
    double flops = 2.0 * c.m * c.n * c.k;
    int repeats = std::max(5, static_cast<int>(2e9 / flops));
    double onednn = median_seconds([&] {
      dnnl_sgemm('N', 'N', c.m, c.n, c.k, 1.0f, a.data(), c.k, b.data(), c.n, 0.0f, out.data(), c.n);
    }, repeats);
    double eigen = median_seconds([&] { out.noalias() = a * b; }, repeats);
    std::printf("| %s (%d x %d x %d) | %.1f | %.1f | %.2f |\n", c.what, c.m, c.n, c.k, flops / onednn / 1e9,
                flops / eigen / 1e9, eigen / onednn);
  }

  // Two threads: each takes half of C's rows, or half of its columns (16-column multiples), with
  // one single-threaded quiver::gemm per half, as ops/gemm.cpp does.
  quiver::ThreadBudget two(2);
  const quiver::SerialContext one;
  std::vector<std::vector<float>> evict(2, std::vector<float>(size_t{1} << 20));
  std::printf("\n| GEMM on 2 threads (M x N x K) | cut by rows, us | cut by columns, us | rows / columns | gemm() cuts |\n"
              "|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    if (c.n <= c.m) continue;  // gemm() cuts rows there whatever the size
    RowMatrix a = RowMatrix::Random(c.m, c.k), b = RowMatrix::Random(c.k, c.n), out(c.m, c.n);
    const quiver::GemmShape whole{c.m, c.n, c.k};
    auto halves = [&](bool columns) {
      two.parallel_for(2, 1, [&](int64_t first, int64_t last) {
        for (int64_t half = first; half < last; ++half) {
          const int64_t extent = columns ? c.n / 16 : c.m, unit = columns ? 16 : 1;
          const int64_t begin = std::min<int64_t>(columns ? c.n : c.m, extent * half / 2 * unit);
          const int64_t end = half == 1 ? (columns ? c.n : c.m) : extent / 2 * unit;
          quiver::GemmShape part = whole;
          part.lda = c.k, part.ldb = c.n, part.ldc = c.n;
          if (columns) {
            part.n = end - begin;
            quiver::gemm(out.data() + begin, a.data(), b.data() + begin, part, one);
          } else {
            part.m = end - begin;
            quiver::gemm(out.data() + begin * c.n, a.data() + begin * c.k, b.data(), part, one);
          }
        }
      });
    };
    // Before each timed call both threads overwrite 4 MiB of their own, so B comes from where a
    // training step leaves it (its other ops run in between), not from the last call's L2.
    auto timed = [&](bool columns, int repeats) {
      std::vector<double> times;
      for (int r = 0; r <= repeats; ++r) {  // the first call warms up, untimed
        two.parallel_for(2, 1, [&](int64_t first, int64_t last) {
          for (int64_t t = first; t < last; ++t) std::fill(evict[t].begin(), evict[t].end(), static_cast<float>(r));
        });
        const auto start = std::chrono::steady_clock::now();
        halves(columns);
        if (r > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      std::sort(times.begin(), times.end());
      return times[times.size() / 2];
    };
    const double flops = 2.0 * c.m * c.n * c.k;
    const int repeats = std::max(25, static_cast<int>(2e8 / flops));
    const double rows = timed(false, repeats), columns = timed(true, repeats);
    std::printf("| %s (%d x %d x %d) | %.1f | %.1f | %.2f | %s |\n", c.what, c.m, c.n, c.k, rows * 1e6, columns * 1e6,
                rows / columns, quiver::gemm_cuts_columns(whole, 2) ? "columns" : "rows");
  }
  return 0;
}
