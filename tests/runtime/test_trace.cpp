// The Chrome trace: valid JSON in the Trace Event Format, one complete event per op execution
// with the fields Perfetto needs and Quiver's own (op, kernel, granted threads, step).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "models/models.h"
#include "runtime/learners.h"
#include "runtime/trainer.h"

namespace quiver {
namespace {

// Per process, as the other tests' files: two copies of the suite at once must not share a file.
std::filesystem::path temp_trace(const std::string& name) {
  return std::filesystem::temp_directory_path() / cat("quiver_test_", name, "_", ::getpid(), ".json");
}

TEST(Trace, TrainingStepsWriteValidChromeTrace) {
  std::filesystem::path path = temp_trace("trace");
  TrainOptions options;
  options.batch = 8;
  options.eval_batch = 8;
  options.threads = 2;
  options.policy = "intra";  // one op at a time on both threads: events in plan order, each granted 2
  Trainer trainer(models::cnn(), options);
  Trace trace;
  trainer.train_plan().set_trace(&trace);
  std::vector<float> images(8 * 784, 0.25f);
  std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int step = 0; step < 3; ++step) trainer.train_step(images.data(), labels.data());
  trace.write(path.string());

  std::ifstream in(path);
  nlohmann::json document = nlohmann::json::parse(in);  // throws on invalid JSON
  const auto& events = document.at("traceEvents");
  const size_t ops = trainer.train_plan().steps().size();
  ASSERT_EQ(events.size(), 3 * ops);
  std::set<std::string> names;
  int64_t last_start = -1;
  for (const auto& event : events) {
    EXPECT_EQ(event.at("ph"), "X");
    EXPECT_TRUE(event.at("ts").is_number_integer());
    EXPECT_GE(event.at("dur").get<int64_t>(), 0);
    EXPECT_TRUE(event.at("tid").is_number_integer());
    EXPECT_EQ(event.at("args").at("granted_threads"), 2);
    int64_t step = event.at("args").at("step");
    EXPECT_TRUE(step >= 1 && step <= 3);
    EXPECT_FALSE(event.at("args").at("op").get<std::string>().empty());
    EXPECT_FALSE(event.at("args").at("kernel").get<std::string>().empty());
    EXPECT_GE(event.at("ts").get<int64_t>(), last_start);  // the serial executor runs in order
    last_start = event.at("ts");
    names.insert(event.at("name"));
  }
  EXPECT_EQ(names.size(), ops);
  EXPECT_TRUE(names.count("conv1/conv"));
  std::filesystem::remove(path);
}

// A learner group's trace: each learner's ops in a process row of its own (pid j + 2, named
// "learner j"), and in the training loop's row (pid 1) one feeder hand-over per round. The SMA
// pass is on the learners' rows: each learner's share of it per round, or under a staleness bound
// each learner's absorption.
TEST(Trace, LearnersHaveRowsOfTheirOwnBesideTheFeederAndTheSync) {
  Dataset data;
  data.count = 64, data.rows = 28, data.cols = 28;
  for (int64_t i = 0; i < data.count * 784; ++i) data.images.push_back(static_cast<float>(i % 97) / 97.0f);
  for (int64_t i = 0; i < data.count; ++i) data.labels.push_back(static_cast<int32_t>(i % 10));
  for (int staleness : {0, 1}) {
    const std::filesystem::path path = temp_trace(cat("learners_trace_", staleness));
    TrainOptions train;
    train.batch = 8;
    train.eval_batch = 8;
    train.policy = "serial";
    train.trace_path = path.string();
    LearnerOptions options{2, 1, SmaOptions{}};
    options.staleness = staleness;
    LearnerGroup group(models::mlp(), train, options);
    const TrainReport report = group.fit(data, nullptr, 1);  // 8 batches: 4 rounds of 2
    ASSERT_EQ(report.steps, 4);
    std::ifstream in(path);
    const nlohmann::json document = nlohmann::json::parse(in);
    std::map<int, std::string> process_names;
    std::map<std::string, int> loop_work;  // the training loop's events by name
    std::map<int, std::set<int64_t>> steps_of;  // learner -> the steps its ops ran in
    std::map<int, std::set<int64_t>> shares_of;  // learner -> the rounds it took a share of the SMA pass in
    int absorbs = 0;
    for (const auto& event : document.at("traceEvents")) {
      const int pid = event.at("pid");
      if (event.at("ph") == "M") {
        process_names[pid] = event.at("args").at("name");
        continue;
      }
      const auto& args = event.at("args");
      if (pid == 1) {
        EXPECT_FALSE(args.contains("learner"));
        ++loop_work[event.at("name")];
        EXPECT_EQ(event.at("cat"), event.at("name") == "next batches" ? "feeder" : "sync");
        continue;
      }
      ASSERT_TRUE(pid == 2 || pid == 3) << pid;
      EXPECT_EQ(args.at("learner"), pid - 2);
      if (event.at("name") == "sma absorb") {
        ++absorbs;
      } else if (event.at("name") == "sma round") {
        EXPECT_EQ(event.at("cat"), "sync");
        EXPECT_TRUE(shares_of[pid - 2].insert(args.at("step").get<int64_t>()).second) << "one share a round";
      } else {
        steps_of[pid - 2].insert(args.at("step").get<int64_t>());
      }
    }
    EXPECT_EQ(process_names, (std::map<int, std::string>{{1, "training loop"}, {2, "learner 0"}, {3, "learner 1"}}));
    EXPECT_EQ(loop_work["next batches"], 4) << "one hand-over of the round's batches per round";
    EXPECT_EQ(steps_of[0], (std::set<int64_t>{1, 2, 3, 4}));
    EXPECT_EQ(steps_of[1], (std::set<int64_t>{1, 2, 3, 4}));
    EXPECT_EQ(loop_work.count("sma round"), 0u);
    if (staleness == 0) {
      EXPECT_EQ(shares_of[0], (std::set<int64_t>{1, 2, 3, 4}));
      EXPECT_EQ(shares_of[1], (std::set<int64_t>{1, 2, 3, 4}));
      EXPECT_EQ(absorbs, 0);
    } else {
      EXPECT_TRUE(shares_of.empty());
      EXPECT_EQ(absorbs, 8) << "each learner absorbs its correction once a round";
    }
    std::filesystem::remove(path);
  }
}

// A group resumed from a checkpoint numbers its rounds on from the checkpoint's: round r's ops on
// every learner, their shares of the SMA pass and the feeder's hand-over all carry step r. (The
// replicas once counted from 1 while the group's own work counted on: each round read as two.)
TEST(Trace, AResumedGroupNumbersItsRoundsOnFromTheCheckpoint) {
  Dataset data;
  data.count = 64, data.rows = 28, data.cols = 28;
  for (int64_t i = 0; i < data.count * 784; ++i) data.images.push_back(static_cast<float>(i % 89) / 89.0f);
  for (int64_t i = 0; i < data.count; ++i) data.labels.push_back(static_cast<int32_t>(i % 10));
  const std::filesystem::path checkpoint = temp_trace("resumed_checkpoint"), path = temp_trace("resumed");
  TrainOptions train;
  train.batch = 8;
  train.eval_batch = 8;
  train.policy = "serial";
  const LearnerOptions options{2, 1, SmaOptions{}};
  {
    LearnerGroup group(models::mlp(), train, options);
    group.fit(data, nullptr, 1);  // 8 batches: rounds 1-4
    group.save(checkpoint.string());
  }
  train.trace_path = path.string();
  {
    LearnerGroup resumed(models::mlp(), train, options);
    resumed.load(checkpoint.string());
    resumed.fit(data, nullptr, 1);  // rounds 5-8
    EXPECT_EQ(resumed.rounds_done(), 8);
  }
  std::ifstream in(path);
  const nlohmann::json document = nlohmann::json::parse(in);
  std::map<std::string, std::set<int64_t>> steps_of;  // "next batches", "learner j ops", "learner j sma round"
  for (const auto& event : document.at("traceEvents")) {
    if (event.at("ph") != "X") continue;
    const int pid = event.at("pid");
    const std::string name = event.at("name");
    const std::string row = pid == 1 ? name : cat("learner ", pid - 2, name == "sma round" ? " sma round" : " ops");
    steps_of[row].insert(event.at("args").at("step").get<int64_t>());
  }
  const std::set<int64_t> rounds{5, 6, 7, 8};
  EXPECT_EQ(steps_of.size(), 5u);
  for (const auto& [row, steps] : steps_of) EXPECT_EQ(steps, rounds) << row;
  std::filesystem::remove(checkpoint);
  std::filesystem::remove(path);
}

// A run that stops on an error (here a NaN loss) still writes its trace, up to the failing step:
// that is the trace one wants most. The error that stopped it is the one reported.
TEST(Trace, ARunStoppedByAnErrorStillWritesItsTrace) {
  const std::filesystem::path path = temp_trace("trace_error");
  std::filesystem::remove(path);
  TrainOptions options;
  options.batch = 4;
  options.eval_batch = 4;
  options.policy = "serial";
  options.trace_path = path.string();
  Trainer trainer(models::mlp(), options);
  Dataset data;
  data.count = 8, data.rows = 28, data.cols = 28;
  data.images.assign(8 * 784, 0.5f);
  data.labels = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int64_t i = 0; i < 784; ++i) data.images[i] = std::numeric_limits<float>::quiet_NaN();  // sample 0
  try {
    trainer.fit(data, nullptr);
    FAIL() << "a NaN loss must stop training";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("loss is"), std::string::npos) << error.what();
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << "no trace at " << path;
  const nlohmann::json document = nlohmann::json::parse(in);
  EXPECT_FALSE(document.at("traceEvents").empty());
  std::filesystem::remove(path);
}

TEST(Trace, UnwritablePathIsNamed) {
  Trace trace;
  try {
    trace.write("/nonexistent-dir/trace.json");
    FAIL() << "writing into a missing directory must fail";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent-dir/trace.json"), std::string::npos) << error.what();
  }
}

// A trace that cannot be written at the end of fit() (a full disk, a removed directory) is warned
// about and reported, not thrown: the training is done, and its report (and the checkpoint
// quiver-train saves after it) were lost with the exception.
TEST(Trace, ATraceNotWrittenAfterTrainingKeepsTheReport) {
  const std::string path = "/nonexistent-dir/trace.json";
  const Dataset data = [] {
    Dataset set;
    set.count = 16, set.rows = 28, set.cols = 28;
    set.images.assign(16 * 784, 0.5f);
    for (int i = 0; i < 16; ++i) set.labels.push_back(i % 10);
    return set;
  }();
  std::vector<std::string> warnings;
  const WarningSink previous = set_warning_sink([&](const std::string& message) { warnings.push_back(message); });
  TrainOptions options;
  options.batch = 4;
  options.eval_batch = 4;
  options.policy = "serial";
  options.trace_path = path;
  Trainer trainer(models::mlp(), options);
  const TrainReport single = trainer.fit(data, nullptr);
  EXPECT_EQ(single.steps, 4);
  EXPECT_NE(single.trace_error.find(path), std::string::npos) << single.trace_error;
  LearnerGroup group(models::mlp(), options, LearnerOptions{2, 1, SmaOptions{}});
  const TrainReport learners = group.fit(data, nullptr, 1);
  EXPECT_EQ(learners.steps, 2);
  EXPECT_NE(learners.trace_error.find(path), std::string::npos) << learners.trace_error;
  set_warning_sink(previous);
  ASSERT_EQ(warnings.size(), 2u);
  for (const std::string& warning : warnings)
    EXPECT_NE(warning.find("its trace was not written"), std::string::npos) << warning;
  // Written, there is no error.
  options.trace_path = temp_trace("trace_kept").string();
  Trainer written(models::mlp(), options);
  EXPECT_EQ(written.fit(data, nullptr).trace_error, "");
  EXPECT_TRUE(std::filesystem::exists(options.trace_path));
  std::filesystem::remove(options.trace_path);
}

TEST(Trace, NamesAreEscaped) {
  Trace trace;
  trace.record(TraceEvent{"a \"quoted\" \\ name\n", "op", "k", 0, 1, 0, 1, 1, -1});
  nlohmann::json document = nlohmann::json::parse(trace.json());
  EXPECT_EQ(document.at("traceEvents").at(0).at("name"), "a \"quoted\" \\ name\n");
}

// Node names are any bytes: UTF-8 passes as it is, and bytes that are not UTF-8 (Latin-1 'caf\xe9',
// a stray continuation byte, a cut sequence) become the characters of the same value, so the
// trace stays JSON (a JSON parser refused the file before).
TEST(Trace, NamesThatAreNotUtf8StayValidJson) {
  Trace trace;
  trace.record(TraceEvent{"caf\xe9", "op", "k", 0, 1, 0, 1, 1, -1});
  trace.record(TraceEvent{"caf\xc3\xa9 \xe2\x82\xac", "op", "k", 1, 1, 0, 1, 1, -1});  // UTF-8: "café €"
  trace.record(TraceEvent{"\x80x\xe2\x82", "op", "k", 2, 1, 0, 1, 1, -1});
  nlohmann::json document = nlohmann::json::parse(trace.json());  // throws on invalid UTF-8
  EXPECT_EQ(document.at("traceEvents").at(0).at("name"), "caf\xc3\xa9");
  EXPECT_EQ(document.at("traceEvents").at(1).at("name"), "caf\xc3\xa9 \xe2\x82\xac");
  EXPECT_EQ(document.at("traceEvents").at(2).at("name"), "\xc2\x80x\xc3\xa2\xc2\x82");
}

}  // namespace
}  // namespace quiver
