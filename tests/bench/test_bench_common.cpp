// The benchmarks' shared helpers (bench/bench_common.h): how their tables print numbers and how
// their flags are read.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "bench/bench_common.h"

namespace quiver {
namespace {

// Ratios and times are rounded, not cut: a ratio of 0.9699 beside a 0.97 floor once read 0.96.
TEST(BenchCommon, NumbersAreRoundedWithTheirTrailingZeros) {
  EXPECT_EQ(bench::fixed(0.9699), "0.97");
  EXPECT_EQ(bench::fixed(1.2754), "1.28");
  EXPECT_EQ(bench::fixed(1.0), "1.00");
  EXPECT_EQ(bench::fixed(12.345, 1), "12.3");
  EXPECT_EQ(bench::fixed(0.004), "0.00");
}

// A flag that the bench does not have is named as unknown wherever it stands (last included), a
// known one with nothing after it as missing its value, and a word that is no flag as such.
TEST(BenchCommon, FlagsAreReadWithClearErrors) {
  const char* options = "--models --runs";
  auto error_of = [&](std::vector<std::string> words) {
    std::vector<char*> argv;
    for (std::string& word : words) argv.push_back(word.data());
    int i = 1;
    try {
      bench::flag_value(static_cast<int>(argv.size()), argv.data(), i, options);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("accepted, i = ") + std::to_string(i);
  };
  EXPECT_EQ(error_of({"bench", "--bogus"}), "unknown option '--bogus' (--models --runs)");
  EXPECT_EQ(error_of({"bench", "--run", "3"}), "unknown option '--run' (--models --runs)");  // no prefix matching
  EXPECT_EQ(error_of({"bench", "--runs"}), "--runs: missing value (see --help)");
  EXPECT_EQ(error_of({"bench", "stray"}), "unexpected argument 'stray' (see --help)");
  EXPECT_EQ(error_of({"bench", "--runs", "3"}), "accepted, i = 2");
}

// A list flag takes each item once: a repeated one would merge into the first one's row or column
// (--learners 2,2 put both groups' rates under one key); empty items and trailing commas are named.
TEST(BenchCommon, ListsAreReadItemByItemAndOnce) {
  EXPECT_EQ(bench::split("--learners", "1,2,4"), (std::vector<std::string>{"1", "2", "4"}));
  // What reading `text` as a list (`parse`: split or int_list) says of it.
  auto error_of = [](auto parse, const std::string& text) {
    try {
      parse("--learners", text);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  auto split = [](const std::string& flag, const std::string& text) { return bench::split(flag, text); };
  auto ints = [](const std::string& flag, const std::string& text) { return bench::int_list(flag, text, 256); };
  EXPECT_EQ(error_of(split, "2,2"), "--learners: '2' is given twice in '2,2'");
  EXPECT_EQ(error_of(split, "1,,2"), "--learners: empty item in '1,,2'");
  EXPECT_EQ(error_of(split, "1,2,"), "--learners: expected a comma-separated list, got '1,2,'");
  // Numbers are compared as numbers: 2 and 02 are one column (they once were two, pooled).
  EXPECT_EQ(bench::int_list("--learners", "1,2,16"), (std::vector<int>{1, 2, 16}));
  EXPECT_EQ(error_of(ints, "2,02"), "--learners: '02' is given twice in '2,02' (as 2)");
  EXPECT_EQ(error_of(ints, "1,+1"), "--learners: '+1' is given twice in '1,+1' (as 1)");
  EXPECT_EQ(error_of(ints, "1,257"), "--learners: expected a whole number from 1 to 256, got '257'");
}

// A seed takes what quiver-train's --seed takes (0 to 2^63 - 1), not only an int's range; the
// counts stay ints.
TEST(BenchCommon, WholeNumbersTakeSixtyFourBitsWhereAsked) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(bench::to_whole("--seed", "4294967296", kMax, 0), int64_t{4294967296});
  EXPECT_EQ(bench::to_whole("--seed", "9223372036854775807", kMax, 0), kMax);
  auto error_of = [](auto read) {
    try {
      read();
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(error_of([&] { bench::to_whole("--seed", "9223372036854775808", kMax, 0); }),
            "--seed: expected a whole number from 0 to 9223372036854775807, got '9223372036854775808'");
  EXPECT_EQ(error_of([&] { bench::to_whole("--seed", "-1", kMax, 0); }),
            "--seed: expected a whole number from 0 to 9223372036854775807, got '-1'");
  EXPECT_EQ(error_of([] { bench::to_int("--runs", "2147483648", std::numeric_limits<int>::max()); }),
            "--runs: expected a whole number from 1 to 2147483647, got '2147483648'");
}

// Every run times every configuration once; the first in the given order, the later ones so that
// a configuration does not always follow the same other one (a rotation of one order did: the
// neighbours stayed the same in every run).
TEST(BenchCommon, EachRunTimesEveryConfigurationOnceAndNeighboursChange) {
  constexpr size_t kConfigurations = 5;
  constexpr int kRuns = 9;
  EXPECT_EQ(bench::run_order(kConfigurations, 0), (std::vector<size_t>{0, 1, 2, 3, 4}));
  std::vector<std::set<size_t>> before(kConfigurations);  // the configurations timed right before each
  for (int run = 0; run < kRuns; ++run) {
    std::vector<size_t> order = bench::run_order(kConfigurations, run);
    EXPECT_EQ(order, bench::run_order(kConfigurations, run)) << "run " << run << ": the same every time";
    for (size_t i = 1; i < order.size(); ++i) before[order[i]].insert(order[i - 1]);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4})) << "run " << run;
  }
  for (size_t c = 0; c < kConfigurations; ++c)
    EXPECT_GE(before[c].size(), 2u) << "configuration " << c << " always followed the same one in " << kRuns << " runs";
  EXPECT_TRUE(bench::run_order(0, 3).empty());
  EXPECT_EQ(bench::run_order(1, 3), (std::vector<size_t>{0}));
}

}  // namespace
}  // namespace quiver
