// quiver-bench-gemm: the measurements behind Quiver's GEMM choices. For the GEMM shapes of the
// bundled models (forward and weight-gradient products at batch 16, 64, 256) it times one thread
// of oneDNN's sgemm (what ops/gemm.cpp calls on each slice) against Eigen's single-threaded
// matrix product, and prints GFLOP/s and the ratio; then, on 2 threads, the same products cut by
// rows and by columns (ops/gemm.cpp's gemm_cuts_columns picks one). Medians of several repeats.
#include <Eigen/Core>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench/bench_common.h"
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
  return quiver::bench::median(times);
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

  // Two threads: each takes half of C's rows, or half of its columns (16-column units), with one
  // single-threaded quiver::gemm per half, as ops/gemm.cpp cuts them. Besides the cases above,
  // the LSTM's input-weight gradient (A transposed: x^T times the gates' gradient), whose B is the
  // largest of the bundled models' at batch 64.
  struct Cut { const char* what; int m, n, k; bool trans_a; };
  std::vector<Cut> cuts;
  for (const Case& c : cases)
    if (c.n > c.m) cuts.push_back({c.what, c.m, c.n, c.k, false});  // else gemm() cuts rows whatever the size
  for (int batch : {16, 64, 256}) cuts.push_back({"lstm input weight grad", 28, 512, batch * 28, true});
  quiver::ThreadBudget two_threads(2);
  const quiver::SerialContext one_thread;
  std::vector<std::vector<float>> evict(2, std::vector<float>(size_t{1} << 20));
  std::printf("\n| GEMM on 2 threads (M x N x K) | cut by rows, us | cut by columns, us | rows time / columns time | gemm() cuts |\n"
              "|---|---|---|---|---|\n");
  for (const Cut& c : cuts) {
    std::vector<float> a(static_cast<size_t>(c.m) * c.k, 0.5f), b(static_cast<size_t>(c.k) * c.n, 0.25f),
        out(static_cast<size_t>(c.m) * c.n);
    const quiver::GemmShape whole{c.m, c.n, c.k, c.trans_a, false};
    auto halves = [&](bool columns) {
      two_threads.parallel_for(2, 1, [&](int64_t first, int64_t last) {
        for (int64_t half = first; half < last; ++half) {
          const int64_t size = columns ? c.n : c.m, unit = columns ? 16 : 1;
          const int64_t units = (size + unit - 1) / unit;
          const int64_t begin = std::min(size, units * half / 2 * unit), end = std::min(size, units * (half + 1) / 2 * unit);
          quiver::GemmShape part = whole;
          part.lda = c.trans_a ? c.m : c.k, part.ldb = c.n, part.ldc = c.n;
          if (columns) {
            part.n = end - begin;
            quiver::gemm(out.data() + begin, a.data(), b.data() + begin, part, one_thread);
          } else {
            part.m = end - begin;
            quiver::gemm(out.data() + begin * c.n, a.data() + (c.trans_a ? begin : begin * c.k), b.data(), part,
                         one_thread);
          }
        }
      });
    };
    // Rows and columns alternate, in turn first, so a phase of this shared host hits both. Before
    // each timed call both threads overwrite 4 MiB of their own, so B comes from where a training
    // step leaves it (its other ops run in between), not from the last call's L2.
    const double flops = 2.0 * c.m * c.n * c.k;
    const int repeats = std::max(25, static_cast<int>(2e8 / flops));
    std::vector<double> times[2];  // [0]: by rows, [1]: by columns
    for (int r = 0; r <= repeats; ++r) {  // the first pair warms up, untimed
      for (int turn = 0; turn < 2; ++turn) {
        const bool columns = (turn + r) % 2 == 1;
        two_threads.parallel_for(2, 1, [&](int64_t first, int64_t last) {
          for (int64_t t = first; t < last; ++t) std::fill(evict[t].begin(), evict[t].end(), static_cast<float>(r));
        });
        const auto start = std::chrono::steady_clock::now();
        halves(columns);
        if (r > 0) times[columns].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    }
    const double rows = quiver::bench::median(times[0]), columns = quiver::bench::median(times[1]);
    std::printf("| %s (%d x %d x %d) | %.1f | %.1f | %.2f | %s |\n", c.what, c.m, c.n, c.k, rows * 1e6, columns * 1e6,
                rows / columns, quiver::gemm_cuts_columns(whole, 2) ? "columns" : "rows");
  }
  return 0;
}
