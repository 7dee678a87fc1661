// The cache-line hand-off probe: a measurement between two allowed CPUs, bad CPUs and counts
// refused by name, and the benches' far/near classification against the lowest probe.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <unistd.h>

#include "core/error.h"
#include "tests/error_of.h"
#include "runtime/placement.h"
#include "runtime/thread_budget.h"
#include "tests/runtime/address_space.h"

namespace quiver {
namespace {

using test::error_of;

TEST(Placement, AllowedCpusAreTheAffinityMask) {
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_EQ(static_cast<int>(cpus.size()), available_cores());
  for (size_t i = 1; i < cpus.size(); ++i) EXPECT_LT(cpus[i - 1], cpus[i]);
}

TEST(Placement, HandoffBetweenTwoCpusIsMeasured) {
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "one allowed CPU: no hand-off to measure";
  const double ns = handoff_ns(cpus[0], cpus[1], 500, 3);
  EXPECT_TRUE(std::isfinite(ns));
  EXPECT_GT(ns, 0.0);
  // Either way round: the same pair of caches.
  EXPECT_GT(handoff_ns(cpus[1], cpus[0], 500, 3), 0.0);
}

// A probe whose second thread cannot start (no address space left for its stack) is an Error:
// the first thread, waiting to meet it, is released and joined. (Its std::thread was destroyed
// joinable by the unwinding, which ends the process.) In a child process with its address space
// capped, not under sanitizers, whose shadow memory the cap breaks.
TEST(Placement, AProbeThatCannotStartItsThreadsIsAnError) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "caps the address space, which a sanitizer's shadow memory needs";
#else
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "one allowed CPU: no hand-off to probe";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        alarm(30);
        testing::limit_address_space_to_now_plus(int64_t{12} << 20);  // one 8 MiB stack, not two
        try {
          handoff_ns(cpus[0], cpus[1], 10, 1);
        } catch (const Error& error) {
          std::fprintf(stderr, "%s\n", error.what());
          std::_Exit(3);
        }
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(3), "handoff_ns: cannot start a thread");
#endif
}

TEST(Placement, BadCpusAndCountsAreRefusedByName) {
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_NE(error_of([&] { handoff_ns(cpus[0], -1); }).find("cpu -1 is not one this process may run on"),
            std::string::npos);
  EXPECT_NE(error_of([&] { handoff_ns(cpus[0], cpus[0]); }).find("two different CPUs"), std::string::npos);
  if (cpus.size() >= 2) {
    EXPECT_NE(error_of([&] { handoff_ns(cpus[0], cpus[1], 0); }).find("at least 1, got 0"), std::string::npos);
  }
}

TEST(Placement, FarMeansAboveTheFactorTimesTheLowestProbe) {
  PlacementLog log(2.0);
  EXPECT_FALSE(log.far(1000.0));  // nothing recorded: no reference yet
  log.record(31.0);
  log.record(29.0);
  EXPECT_EQ(log.probes(), 2);
  EXPECT_DOUBLE_EQ(log.lowest(), 29.0);
  EXPECT_DOUBLE_EQ(log.highest(), 31.0);
  EXPECT_FALSE(log.far(58.0));
  EXPECT_TRUE(log.far(58.5));
  log.record(165.0);
  EXPECT_TRUE(log.far(165.0));
  EXPECT_DOUBLE_EQ(log.highest(), 165.0);
  log.record(20.0);  // a lower reference moves the line
  EXPECT_TRUE(log.far(41.0));
  if (log.enabled()) {
    EXPECT_NE(log.summary().find("20-165 ns over 4 probes (far: above 40 ns)"), std::string::npos);
  }
}

TEST(Placement, LogRefusesNonsense) {
  EXPECT_NE(error_of([] { PlacementLog log(1.0); }).find("far_factor must be above 1"), std::string::npos);
  PlacementLog log;
  EXPECT_NE(error_of([&] { log.record(0.0); }).find("must be positive"), std::string::npos);
  EXPECT_NE(error_of([&] { log.record(NAN); }).find("must be positive"), std::string::npos);
  EXPECT_EQ(log.probes(), 0);
}

TEST(Placement, ProbeRecordsWhatItMeasures) {
  PlacementLog log;
  if (!log.enabled()) {
    EXPECT_LT(log.probe(), 0.0);
    EXPECT_EQ(log.probes(), 0);
    return;
  }
  const double ns = log.probe();
  EXPECT_GT(ns, 0.0);
  EXPECT_EQ(log.probes(), 1);
  EXPECT_DOUBLE_EQ(log.lowest(), ns);
  EXPECT_FALSE(log.far(ns));
}

}  // namespace
}  // namespace quiver
