// The performance model: the fit of T(p) against known curves, grants, held-out error, op keys,
// the CPU's name, and the profile cache (round trip; corrupt, foreign and stale files ignored with
// a warning; saves merged and taking turns). The auto policy built on it is tested in
// test_auto_policy.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/builder.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/perf_model.h"
#include "runtime/thread_budget.h"
#include "tests/captured_warnings.h"

namespace quiver {
namespace {

using test::CapturedWarnings;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("quiver_perf_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(PerfModel, FitRecoversAKnownCurve) {
  const double a = 2e-4, b = 3e-3, c = 5e-5;
  std::vector<std::pair<int, double>> points;
  for (int p = 1; p <= 8; ++p) points.push_back({p, a + b / p + c * p});
  ThreadFit fit = fit_thread_curve(points);
  EXPECT_NEAR(fit.a, a, 1e-9);
  EXPECT_NEAR(fit.b, b, 1e-9);
  EXPECT_NEAR(fit.c, c, 1e-9);
  EXPECT_NEAR(fit.predict(16), a + b / 16 + c * 16, 1e-9);
}

TEST(PerfModel, TwoCountsFitAmdahlExactlyAndOneCountIsConstant) {
  ThreadFit two = fit_thread_curve({{1, 10e-3}, {2, 6e-3}});  // a + b = 10, a + b/2 = 6 (ms)
  EXPECT_NEAR(two.a, 2e-3, 1e-12);
  EXPECT_NEAR(two.b, 8e-3, 1e-12);
  EXPECT_DOUBLE_EQ(two.c, 0.0);
  ThreadFit one = fit_thread_curve({{1, 4e-3}});
  EXPECT_DOUBLE_EQ(one.predict(1), 4e-3);
  EXPECT_DOUBLE_EQ(one.predict(7), 4e-3);
  // Points that repeat one count make a singular system for any form with b or c: the fit is
  // finite, near what was measured (PerfModel passes one median a count; fit_thread_curve is public).
  for (const std::vector<std::pair<int, double>>& repeated :
       {std::vector<std::pair<int, double>>{{4, 3e-3}, {4, 5e-3}, {4, 4e-3}},
        std::vector<std::pair<int, double>>{{2, 6e-3}, {2, 6e-3}, {5, 3e-3}}}) {
    const ThreadFit fit = fit_thread_curve(repeated);
    for (int p = 1; p <= 8; ++p) {
      EXPECT_TRUE(std::isfinite(fit.predict(p))) << "p = " << p;
      EXPECT_GT(fit.predict(p), 0.0) << "p = " << p;
    }
    EXPECT_NEAR(fit.predict(repeated.front().first), repeated.front().first == 4 ? 4e-3 : 6e-3, 1.5e-3);
  }
}

// Points whose full fit dips to zero between the counts measured (a = -23e-5 here): it would
// call 10-13 threads, never run, nearly free. Every p up to the model's largest is checked, so
// the fit falls back to a form that stays near what was measured.
TEST(PerfModel, AFitNeverClaimsAnUnmeasuredCountIsNearlyFree) {
  std::vector<std::pair<int, double>> points;
  double shortest = 1.0;
  for (int p : {1, 2, 3, 4, 5, 6, 7, 8, 16}) {
    points.push_back({p, 1e-5 * (-23.0 + 128.0 / p + p)});
    shortest = std::min(shortest, points.back().second);
  }
  const ThreadFit fit = fit_thread_curve(points, 16);
  for (int p = 1; p <= 16; ++p) EXPECT_GE(fit.predict(p), 0.5 * shortest) << p << " threads";
  PerfModel model(16);
  for (auto [p, seconds] : points) model.add_sample("op", p, seconds);
  model.fit();
  EXPECT_FALSE(model.fastest("op") > 8 && model.fastest("op") < 16) << model.fastest("op");
}

// The fit is relative: the same curve in microseconds or in hours has the same shape (an
// absolute singularity threshold once called the hours singular and fitted a flat mean).
TEST(PerfModel, AFitDoesNotDependOnTheUnitOfTime) {
  for (double unit : {1e-6, 1.0, 3600.0, 1e6}) {
    std::vector<std::pair<int, double>> points;
    for (int p = 1; p <= 8; ++p) points.push_back({p, unit * (2.0 + 30.0 / p + 0.5 * p)});
    const ThreadFit fit = fit_thread_curve(points, 8);
    EXPECT_NEAR(fit.b / unit, 30.0, 1e-6) << unit;
    EXPECT_NEAR(fit.c / unit, 0.5, 1e-6) << unit;
  }
}

TEST(PerfModel, GrantIsTheFewestThreadsNearTheBest) {
  PerfModel model(8);
  for (int p : model.profiled_counts()) {
    model.add_sample("scales", p, 1e-4 + 8e-3 / p);          // keeps improving: best at 8
    model.add_sample("saturates", p, 1e-3 + 1e-3 / p + 2e-4 * p);  // best near sqrt(5) ~ 2
    model.add_sample("serial", p, 1e-3 + 1e-5 * p);          // threads only cost
  }
  model.fit();
  EXPECT_EQ(model.fastest("scales"), 8);
  // Within 5% of T(8) = 1.1e-3: 8e-3/p <= 1.155e-3 - 1e-4 needs p >= 7.6.
  EXPECT_EQ(model.grant("scales", 0.05), 8);
  EXPECT_EQ(model.grant("scales", 0.5), 6);  // T(6) = 1.433e-3 <= 1.65e-3 < T(5)
  // Or within `slack` seconds of it, where that is more (a short op's few microseconds are not
  // worth a thread): within 1.2 ms of 1.1e-3, T(4) = 2.1e-3 <= 2.3e-3 < T(3) = 2.77e-3 gives 4;
  // a slack below 5% gives 8.
  EXPECT_EQ(model.grant("scales", 0.05, 1.2e-3), 4);
  EXPECT_EQ(model.grant("scales", 0.05, 1e-5), 8);
  EXPECT_EQ(model.fastest("saturates"), 2);
  EXPECT_EQ(model.grant("serial", 0.05), 1);
  EXPECT_THROW(model.predict("unknown", 1), Error);
  // A flat curve (an op that does not scale, or a clock too coarse for it): its predictions differ
  // by rounding only, and the fastest count is the fewest (it was 16 of 16 for an op running alone).
  PerfModel wide(16);
  for (int p : wide.profiled_counts()) wide.add_sample("flat", p, 3.3e-4);
  wide.fit();
  EXPECT_EQ(wide.fastest("flat"), 1);
  PerfModel widest(256);  // the fit's rounding grows with the counts
  for (int p : widest.profiled_counts()) widest.add_sample("flat", p, 3.3e-4);
  widest.fit();
  EXPECT_EQ(widest.fastest("flat"), 1);
  // Samples the cache could not hold are refused, not sorted as NaN or saved as what load refuses.
  EXPECT_THROW(wide.add_sample("bad", 0, 1e-3), Error);
  EXPECT_THROW(wide.add_sample("bad", PerfModel::kMostThreads + 1, 1e-3), Error);
  EXPECT_THROW(wide.add_sample("bad", 1, std::nan("")), Error);
  EXPECT_THROW(wide.add_sample("bad", 1, -1.0), Error);
  EXPECT_THROW(wide.replace_samples("bad", 1, {1e-3, std::numeric_limits<double>::infinity()}), Error);
  EXPECT_EQ(wide.samples("bad", 1), 0);
  EXPECT_EQ(model.profiled_counts(), (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(PerfModel(20).profiled_counts(), (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 16, 20}));
}

TEST(PerfModel, HeldOutErrorNeedsThreeCountsAndSeesNoise) {
  PerfModel two(2);
  two.add_sample("op", 1, 1e-3);
  two.add_sample("op", 2, 6e-4);
  EXPECT_TRUE(two.held_out_errors().empty());
  PerfModel exact(6), noisy(6);
  for (int p = 1; p <= 6; ++p) {
    exact.add_sample("op", p, 1e-4 + 1e-3 / p + 1e-5 * p);
    noisy.add_sample("op", p, (1e-4 + 1e-3 / p + 1e-5 * p) * (p % 2 ? 1.2 : 0.8));
  }
  ASSERT_FALSE(exact.held_out_errors().empty());
  ASSERT_FALSE(noisy.held_out_errors().empty());
  for (double error : exact.held_out_errors()) EXPECT_LT(error, 1e-6);
  double worst = 0.0;
  for (double error : noisy.held_out_errors()) worst = std::max(worst, error);
  EXPECT_GT(worst, 0.1);
}

TEST(PerfModel, OpKeysSeparateShapesAndAttributes) {
  GraphBuilder b;
  Value x = b.input("x", Shape{4, 8}), y = b.input("y", Shape{8, 3}), z = b.input("z", Shape{8, 5});
  b.matmul(x, y);
  b.matmul(x, z);
  b.matmul(x, x, false, true);
  const Graph& g = b.graph();
  std::set<std::string> keys;
  for (const Node& node : g.nodes()) keys.insert(op_key(g, node, "onednn_sgemm"));
  EXPECT_EQ(keys.size(), 3u);
  // Ops whose inputs have the same shapes and that differ in their attributes alone (a
  // transposed side costs a GEMM up to twice the time; another pool window is other work).
  GraphBuilder same_shapes;
  Value s = same_shapes.input("s", Shape{8, 8});
  same_shapes.matmul(s, s);
  same_shapes.matmul(s, s, true, false);
  same_shapes.matmul(s, s, false, true);
  Value image = same_shapes.input("image", Shape{1, 2, 6, 6});
  same_shapes.max_pool2d(image, 2);
  same_shapes.max_pool2d(image, 3);
  same_shapes.max_pool2d(image, 2, 1);
  std::set<std::string> attribute_keys;
  for (const Node& node : same_shapes.graph().nodes())
    attribute_keys.insert(op_key(same_shapes.graph(), node, "kernel"));
  EXPECT_EQ(attribute_keys.size(), 6u);
}

// The cache is keyed by the CPU's design. x86 names it; a 64-bit ARM kernel gives only numbers per
// core (so every ARM host read "unknown" and shared one cache), and a big.LITTLE chip has two.
TEST(PerfModel, CpuModelIsReadOnEveryArchitecture) {
  EXPECT_EQ(cpu_model_of("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n"
                         "\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n"),
            "Intel(R) Xeon(R) CPU @ 2.20GHz");
  const std::string neoverse_n1 =
      "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n"
      "CPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: 1\n\n";
  EXPECT_EQ(cpu_model_of(neoverse_n1 + neoverse_n1), "ARM implementer 0x41 part 0xd0c variant 0x3 revision 1");
  const std::string little =
      "processor\t: 4\nCPU implementer\t: 0x41\nCPU variant\t: 0x2\nCPU part\t: 0xd05\nCPU revision\t: 0\n";
  EXPECT_EQ(cpu_model_of(neoverse_n1 + little),  // the last block has no blank line after it
            "ARM implementer 0x41 part 0xd0c variant 0x3 revision 1 + ARM implementer 0x41 part 0xd05 variant 0x2 "
            "revision 0");
  EXPECT_NE(cpu_model_of(neoverse_n1), cpu_model_of(little));
  EXPECT_EQ(cpu_model_of("processor\t: 0\ncpu\t\t: POWER9 (raw), altivec supported\nclock\t\t: 2300.000000MHz\n"),
            "POWER9 (raw), altivec supported");
  EXPECT_EQ(cpu_model_of("processor\t: 0\nisa\t\t: rv64imafdc\nmmu\t\t: sv39\nuarch\t\t: sifive,u74-mc\n"),
            "sifive,u74-mc");
  EXPECT_EQ(cpu_model_of(""), "unknown");
  EXPECT_EQ(cpu_model_of("garbage without colons\n\n"), "unknown");
  EXPECT_EQ(PerfModel::cpu_model(), cpu_model_of([] {
              std::ifstream in("/proc/cpuinfo");
              std::stringstream text;
              text << in.rdbuf();
              return text.str();
            }()));
}

// Hosts of different CPUs that share a home directory keep a cache file each: the default path
// names this CPU's model.
TEST(PerfModel, DefaultCacheFileNamesTheCpuModel) {
  EXPECT_EQ(cpu_file_tag("AMD EPYC 9R14 96-Core Processor"), "amd-epyc-9r14-96-core-processor");
  EXPECT_EQ(cpu_file_tag("  Intel(R) Xeon(R) CPU @ 2.20GHz "), "intel-r-xeon-r-cpu-2-20ghz");
  EXPECT_EQ(cpu_file_tag("../../etc"), "etc");  // nothing that leaves the directory
  EXPECT_EQ(cpu_file_tag(""), "unknown");
  EXPECT_EQ(cpu_file_tag(std::string(200, 'x')).size(), 64u);
  struct Restore {  // ctest sets QUIVER_PROFILE_CACHE for every test
    const char* name;
    std::string value;
    bool had;
    explicit Restore(const char* n) : name(n), had(std::getenv(n) != nullptr) {
      if (had) value = std::getenv(n);
    }
    ~Restore() { had ? setenv(name, value.c_str(), 1) : unsetenv(name); }
  } explicit_path("QUIVER_PROFILE_CACHE"), xdg("XDG_CACHE_HOME");
  unsetenv("QUIVER_PROFILE_CACHE");
  setenv("XDG_CACHE_HOME", "/tmp/xdg-test", 1);
  EXPECT_EQ(default_profile_cache(), "/tmp/xdg-test/quiver/profiles-" + cpu_file_tag(PerfModel::cpu_model()) + "-" +
                                         std::to_string(available_cores()) + "cores-" +
                                         cpu_file_tag(PerfModel::build_flavor()) + ".json");
  setenv("QUIVER_PROFILE_CACHE", "/tmp/chosen.json", 1);
  EXPECT_EQ(default_profile_cache(), "/tmp/chosen.json");
}

TEST(PerfModel, CacheRoundTripAndBadFilesAreIgnoredWithAWarning) {
  const std::string path = temp_path("cache.json");
  PerfModel model(2);
  model.add_sample("conv", 1, 2e-3);
  model.add_sample("conv", 2, 1.2e-3);
  model.add_sample("relu", 1, 1e-5);
  model.add_sample("relu", 2, 2e-5);
  model.fit();
  model.save(path);
  {
    CapturedWarnings warnings;
    PerfModel loaded(2);
    ASSERT_TRUE(loaded.load(path));
    EXPECT_TRUE(warnings.messages.empty());
    EXPECT_DOUBLE_EQ(loaded.predict("conv", 2), model.predict("conv", 2));
    EXPECT_EQ(loaded.grant("relu", 0.05), 1);
    EXPECT_TRUE(loaded.complete("conv", 1));
  }
  nlohmann::json original;
  std::ifstream(path) >> original;
  auto expect_ignored = [&](const std::string& text, const std::string& word) {
    std::ofstream(path, std::ios::trunc) << text;
    CapturedWarnings warnings;
    PerfModel loaded(2);
    EXPECT_FALSE(loaded.load(path)) << text.substr(0, 80);
    EXPECT_EQ(loaded.size(), 0u);
    ASSERT_EQ(warnings.messages.size(), 1u);
    EXPECT_NE(warnings.messages[0].find(word), std::string::npos) << warnings.messages[0];
    EXPECT_NE(warnings.messages[0].find(path), std::string::npos) << warnings.messages[0];
  };
  expect_ignored("{\"format\": \"quiver-profile-cache\", \"version\": 1, \"ops\": {", "corrupt");
  // A file that is no cache at all (text, another JSON document) is said to be left as it is.
  expect_ignored("not json at all", "as a profile cache: not a profile cache (it is left as it is");
  expect_ignored("{\"something\": \"else\"}", "as a profile cache: not a profile cache (it is left as it is");
  nlohmann::json bad = original;
  bad["ops"]["conv"]["median_s"] = {1e-3};  // two counts, one time
  expect_ignored(bad.dump(), "corrupt");
  bad = original;
  bad["ops"]["conv"]["median_s"] = {-1.0, 1e-3};
  expect_ignored(bad.dump(), "corrupt");
  // Thread counts must be whole numbers a machine can have, times those an op can take.
  for (const nlohmann::json& threads : {nlohmann::json{2.7, 2}, nlohmann::json{4294967297LL, 2}, nlohmann::json{0, 2}}) {
    bad = original;
    bad["ops"]["conv"]["threads"] = threads;
    expect_ignored(bad.dump(), "corrupt");
  }
  {  // an entry nested a million deep is named by its kind: printing it recursed off the stack
    bad = original;
    bad["ops"]["conv"]["threads"] = {"DEEP", 2};
    std::string text = bad.dump();
    text.replace(text.find("\"DEEP\""), 6, std::string(1000000, '[') + std::string(1000000, ']'));
    expect_ignored(text, "invalid entry (an array of 1 threads");
  }
  for (double seconds : {1.7e308, 1e-12, 5e3}) {
    bad = original;
    bad["ops"]["conv"]["median_s"] = {seconds, 1e-3};
    expect_ignored(bad.dump(), "corrupt");
  }
  bad = original;
  bad["cpu"] = "A CPU from another machine";
  expect_ignored(bad.dump(), "another machine");
  bad = original;
  bad["version"] = 0;
  expect_ignored(bad.dump(), "stale");
  // The same CPU with other cores to run on: timings at a thread count are of other cores.
  ASSERT_EQ(original.at("cores"), available_cores());
  bad = original;
  bad["cores"] = available_cores() + 14;
  expect_ignored(bad.dump(), cat("measured with ", available_cores() + 14, " cores to run on, this process has ",
                                 available_cores()));
  for (const nlohmann::json& cores : {nlohmann::json(2.5), nlohmann::json("2")}) {
    bad = original;
    bad["cores"] = cores;
    expect_ignored(bad.dump(), "corrupt");
  }
  bad.erase("cores");
  expect_ignored(bad.dump(), "corrupt");
  bad = original;
  bad["version"] = 1;  // a cache from before the count of cores was recorded
  bad.erase("cores");
  expect_ignored(bad.dump(), "stale");
  {  // every learner's executor loads the same cache: the warning is given once, not per executor
    CapturedWarnings warnings;
    PerfModel first(2), second(2);
    EXPECT_FALSE(first.load(path));
    EXPECT_FALSE(second.load(path));
    EXPECT_EQ(warnings.messages.size(), 1u);
  }
  {
    CapturedWarnings warnings;
    PerfModel missing(2);
    EXPECT_FALSE(missing.load(path + ".does-not-exist"));
    EXPECT_TRUE(warnings.messages.empty()) << "a first run has no cache: nothing to warn about";
  }
  bad = original;
  bad["quiver"] = "0.1";  // timings of older kernels
  expect_ignored(bad.dump(), "stale");
  bad.erase("quiver");  // an older format that did not name Quiver's version: stale, not corrupt
  bad["version"] = 0;
  expect_ignored(bad.dump(), "stale");
  // Saving replaces a cache, stale or corrupt, or an empty file (mktemp's), but not a file that is
  // no cache at all: the path may be a checkpoint or notes given by mistake.
  std::ofstream(path, std::ios::trunc).close();
  model.save(path);
  ASSERT_TRUE(PerfModel(2).load(path));
  // A JSON document with comments or a trailing comma does not parse either: still not a cache.
  for (const std::string& other : {std::string("not json at all"), std::string("{\"notes\": [1, 2]}"),
                                   std::string("{\n // settings\n \"a\": 1,\n}\n")}) {
    std::ofstream(path, std::ios::trunc) << other;
    try {
      model.save(path);
      ADD_FAILURE() << "replaced a file that is no profile cache: " << other;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("is left as it is: not a profile cache"), std::string::npos)
          << error.what();
    }
    std::ifstream in(path);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), other);
  }
  // A file too large to be read as a cache is left too, and the refusal says why (it once said
  // "not a profile cache" of whatever load() could not read).
  std::filesystem::resize_file(path, (std::uintmax_t{64} << 20) + 1);  // sparse: no 64 MiB written
  try {
    model.save(path);
    ADD_FAILURE() << "replaced a file of more than 64 MiB";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("is left as it is: not a regular file of at most 64 MiB"),
              std::string::npos) << error.what();
  }
  EXPECT_EQ(std::filesystem::file_size(path), (std::uintmax_t{64} << 20) + 1);
  // An endless file (reading it would never stop) and a directory: refused before reading.
  for (const std::string& odd : {std::string("/dev/zero"), std::filesystem::temp_directory_path().string()}) {
    CapturedWarnings warnings;
    PerfModel loaded(2);
    EXPECT_FALSE(loaded.load(odd));
    ASSERT_EQ(warnings.messages.size(), 1u) << odd;
    EXPECT_NE(warnings.messages[0].find("not a regular file"), std::string::npos) << warnings.messages[0];
  }
  std::filesystem::remove(path);
}

// Two processes that profile into one cache each save their own timings over what the file holds
// by then: the second save keeps the keys the first wrote (its own measured timings win where both
// timed an op at the same thread count), so neither's profiles are lost.
TEST(PerfModel, SavesMergeWhatAnotherProcessWroteMeanwhile) {
  const std::string path = temp_path("shared_cache.json");
  std::filesystem::remove(path);
  PerfModel mlp(2), lstm(2);
  EXPECT_FALSE(mlp.load(path));
  EXPECT_FALSE(lstm.load(path));
  mlp.add_sample("matmul", 1, 4e-4), mlp.add_sample("matmul", 2, 2.5e-4);
  mlp.add_sample("shared", 1, 1e-4), mlp.add_sample("shared", 2, 1e-4);
  lstm.add_sample("lstm", 1, 9e-4), lstm.add_sample("lstm", 2, 5e-4);
  lstm.add_sample("shared", 1, 3e-4), lstm.add_sample("shared", 2, 3e-4);
  mlp.fit(), lstm.fit();
  mlp.save(path);
  lstm.save(path);
  PerfModel both(2);
  ASSERT_TRUE(both.load(path));
  EXPECT_EQ(both.size(), 3u);
  EXPECT_DOUBLE_EQ(both.measured("matmul", 2), 2.5e-4);
  EXPECT_DOUBLE_EQ(both.measured("lstm", 2), 5e-4);
  EXPECT_DOUBLE_EQ(both.measured("shared", 1), 3e-4) << "the later save's own timing";
  std::filesystem::remove(path);
}

// A save waits for another's lock on the cache's directory, but not for ever: one held past the
// wait (a process stopped while saving) is an error that writes nothing; once it is released the
// save goes through.
TEST(PerfModel, ASaveWaitsForAnotherOnlySoLong) {
  const std::filesystem::path directory = temp_path("locked_dir");
  std::filesystem::remove_all(directory);
  std::filesystem::create_directory(directory);
  const std::string path = (directory / "cache.json").string();
  PerfModel model(2);
  model.add_sample("matmul", 1, 4e-4), model.add_sample("matmul", 2, 2.5e-4);
  model.fit();
  const int held = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);  // another save's lock
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  try {
    model.save(path, 0.2);
    ADD_FAILURE() << "a save must not write while another holds the lock";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("stayed locked by another save for 0.2 s"), std::string::npos)
        << error.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  // An infinite wait is a wait until the lock is given back (its nanoseconds once overflowed into
  // a deadline in the past: the save failed at once).
  std::thread releaser([held] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::close(held);  // released
  });
  std::string failure;
  try {
    model.save(path, std::numeric_limits<double>::infinity());
  } catch (const Error& error) {
    failure = error.what();
  }
  releaser.join();
  EXPECT_EQ(failure, "") << "an infinite wait gave up";
  model.save(path, 0.2);
  PerfModel loaded(2);
  EXPECT_TRUE(loaded.load(path));
  std::filesystem::remove_all(directory);
}

// What a process only loaded does not overwrite the file: another process that refreshed an op
// since, or measured it at more thread counts, keeps its timings. And a time the clock read as 0
// is kept as the shortest a cache holds, so the cache the save writes still loads.
TEST(PerfModel, ASaveWritesOnlyWhatItMeasuredOverTheFile) {
  const std::string path = temp_path("loaded_cache.json");
  std::filesystem::remove(path);
  // `first` lives on: a process that profiled at its start and saves again later (at a trial,
  // when its executor goes).
  PerfModel first(4);
  for (int p = 1; p <= 2; ++p) first.add_sample("conv", p, 5e-3 / p), first.add_sample("gemm", p, 1e-3 / p);
  first.save(path);
  PerfModel narrow(2), wide(4), cnn(2);
  ASSERT_TRUE(narrow.load(path));
  ASSERT_TRUE(wide.load(path));
  ASSERT_TRUE(cnn.load(path));
  cnn.replace_samples("conv", 1, {1e-3});  // refreshed: the host was busy when the cache was made
  cnn.save(path);
  for (int p = 3; p <= 4; ++p) wide.add_sample("gemm", p, 2e-3 / p);  // a wider run profiles 3 and 4
  wide.save(path);
  narrow.replace_samples("gemm", 1, {3e-3});  // a narrower run then refreshes its count 1 ...
  narrow.add_sample("matmul", 1, 0.0);  // ... and times an op shorter than its clock's tick
  narrow.save(path);
  first.save(path);  // its start-up timings are in the file already: the refreshes since stand
  PerfModel after(4);
  ASSERT_TRUE(after.load(path));
  EXPECT_DOUBLE_EQ(after.measured("conv", 1), 1e-3) << "the refresh another process saved";
  EXPECT_DOUBLE_EQ(after.measured("conv", 2), 2.5e-3);
  EXPECT_DOUBLE_EQ(after.measured("gemm", 1), 3e-3) << "the latest save's own timing";
  EXPECT_DOUBLE_EQ(after.measured("gemm", 2), 5e-4);
  for (int p = 3; p <= 4; ++p) EXPECT_DOUBLE_EQ(after.measured("gemm", p), 2e-3 / p) << p << " threads";
  EXPECT_GT(after.measured("matmul", 1), 0.0);
  after.fit();
  EXPECT_TRUE(std::isfinite(after.predict("matmul", 1)));
  first.replace_samples("conv", 1, {4e-3});  // its own refresh, after its last save: this one stands
  first.save(path);
  PerfModel latest(4);
  ASSERT_TRUE(latest.load(path));
  EXPECT_DOUBLE_EQ(latest.measured("conv", 1), 4e-3);
  EXPECT_DOUBLE_EQ(latest.measured("gemm", 1), 3e-3);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace quiver
