// Flush-to-zero inside kernels (core/denormals.h): the scope flushes and restores the thread's
// mode; every body of a thread budget flushes; an op in a plan, under every executor policy,
// reads subnormal inputs as zero and writes no subnormal result.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>

#include "core/builder.h"
#include "core/denormals.h"
#include "runtime/executor.h"
#include "runtime/param_store.h"
#include "runtime/plan.h"
#include "runtime/thread_budget.h"

namespace quiver {
namespace {

// 1e-30 x 1e-10 = 1e-40: subnormal in IEEE arithmetic, zero when flushed. Volatile, so the
// compiler cannot fold it at build time, where no MXCSR applies.
float tiny_product() {
  volatile float a = 1e-30f, b = 1e-10f;
  return a * b;
}

bool flushes_here() { return FlushDenormals::active(); }

TEST(FlushDenormals, ScopeFlushesAndRestoresTheThreadsMode) {
#ifndef QUIVER_HAS_MXCSR
  GTEST_SKIP() << "no MXCSR on this architecture: subnormals stay IEEE";
#else
  ASSERT_FALSE(flushes_here()) << "a test thread starts in IEEE mode";
  EXPECT_EQ(std::fpclassify(tiny_product()), FP_SUBNORMAL);
  {
    const FlushDenormals flushed;
    EXPECT_TRUE(flushes_here());
    EXPECT_EQ(tiny_product(), 0.0f);
    {
      const FlushDenormals nested;  // already flushing: leaves the mode alone on its way out
    }
    EXPECT_TRUE(flushes_here());
  }
  EXPECT_FALSE(flushes_here());
  EXPECT_EQ(std::fpclassify(tiny_product()), FP_SUBNORMAL);
#endif
}

TEST(FlushDenormals, EveryThreadBudgetBodyFlushes) {
#ifndef QUIVER_HAS_MXCSR
  GTEST_SKIP() << "no MXCSR on this architecture";
#else
  for (int threads : {1, 2, 4}) {
    ThreadBudget budget(threads);
    std::atomic<int> bodies{0}, flushed{0};
    budget.parallel_for(64, 1, [&](int64_t, int64_t) {
      ++bodies;
      if (flushes_here() && tiny_product() == 0.0f) ++flushed;
    });
    EXPECT_GT(bodies.load(), 0);
    EXPECT_EQ(flushed.load(), bodies.load()) << threads << " threads";
    EXPECT_FALSE(flushes_here()) << "the caller's mode is restored";
  }
#endif
}

TEST(FlushDenormals, KernelsInAPlanReadAndWriteSubnormalsAsZero) {
#ifndef QUIVER_HAS_MXCSR
  GTEST_SKIP() << "no MXCSR on this architecture";
#else
  GraphBuilder b;
  Value x = b.input("x", Shape{4, 256});
  Value y = b.input("y", Shape{4, 256});
  Value product = b.mul(x, y);  // 1e-30 x 1e-10: subnormal unless flushed
  Value sum = b.add(x, y);      // subnormal + subnormal: read as zero
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {product, sum});
  for (Policy policy : {Policy::Serial, Policy::Intra, Policy::Auto}) {
    SCOPED_TRACE(name_of(policy));
    const float small = std::numeric_limits<float>::denorm_min() * 1000.0f;
    float* xs = plan.input("x").f32();
    float* ys = plan.input("y").f32();
    for (int i = 0; i < 4 * 256; ++i) xs[i] = i % 2 ? small : 1e-30f, ys[i] = i % 2 ? small : 1e-10f;
    ExecutorOptions options;
    options.policy = policy;
    options.threads = 2;
    Executor executor(plan, options);
    for (int step = 0; step < 3; ++step) executor.run();
    const float* p = plan.tensor(product).f32();
    const float* s = plan.tensor(sum).f32();
    for (int i = 0; i < 4 * 256; i += 2) {
      ASSERT_EQ(p[i], 0.0f) << "element " << i << ": 1e-30 x 1e-10 written as a subnormal";
      ASSERT_EQ(s[i + 1], 0.0f) << "element " << i + 1 << ": two subnormals not read as zero";
      ASSERT_EQ(s[i], 1e-30f + 1e-10f) << "element " << i << ": normal sums are untouched";
    }
    EXPECT_FALSE(flushes_here());
  }
#endif
}

}  // namespace
}  // namespace quiver
