// quiver-bench-gemm: the measurement behind Quiver's GEMM choice. For the GEMM shapes of the
// bundled models (forward and weight-gradient products at batch 16, 64, 256) it
// times one thread of oneDNN's sgemm (what ops/gemm.cpp calls on each slice) against Eigen's
// single-threaded matrix product, and prints GFLOP/s and the ratio. Median of several repeats.
#include <Eigen/Core>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "oneapi/dnnl/dnnl.h"

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
                "GEMM shapes at batch 16, 64 and 256: GFLOP/s and the ratio (a markdown table).\n"
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
  return 0;
}
