// The Chrome trace: valid JSON in the Trace Event Format, one complete event per op execution
// with the fields Perfetto needs and Quiver's own (op, kernel, granted threads, step).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "models/models.h"
#include "runtime/trainer.h"

namespace quiver {
namespace {

TEST(Trace, TrainingStepsWriteValidChromeTrace) {
  std::filesystem::path path = std::filesystem::temp_directory_path() / "quiver_test_trace.json";
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

TEST(Trace, UnwritablePathIsNamed) {
  Trace trace;
  try {
    trace.write("/nonexistent-dir/trace.json");
    FAIL() << "writing into a missing directory must fail";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent-dir/trace.json"), std::string::npos) << error.what();
  }
}

TEST(Trace, NamesAreEscaped) {
  Trace trace;
  trace.record(TraceEvent{"a \"quoted\" \\ name\n", "op", "k", 0, 1, 0, 1, 1});
  nlohmann::json document = nlohmann::json::parse(trace.json());
  EXPECT_EQ(document.at("traceEvents").at(0).at("name"), "a \"quoted\" \\ name\n");
}

}  // namespace
}  // namespace quiver
