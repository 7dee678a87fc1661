// quiver-train's command line: good values parse, every bad value names its flag.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "examples/train_options.h"
#include "runtime/thread_budget.h"

namespace quiver {
namespace {

TEST(TrainOptions, ParsesEveryFlag) {
  TrainCommand c = parse_train_command({"--model", "cnn", "--epochs", "3", "--max-steps", "50", "--batch",
                                        "16", "--threads", "2", "--lr", "0.05", "--seed", "9", "--data",
                                        "/tmp/fm", "--optimizer", "adam", "--quiet"});
  EXPECT_EQ(c.model, "cnn");
  EXPECT_EQ(c.train.epochs, 3);
  EXPECT_EQ(c.train.max_steps, 50);
  EXPECT_EQ(c.train.batch, 16);
  EXPECT_EQ(c.train.threads, 2);
  EXPECT_DOUBLE_EQ(c.train.learning_rate, 0.05);
  EXPECT_EQ(c.train.seed, 9u);
  EXPECT_EQ(c.data_dir, "/tmp/fm");
  EXPECT_EQ(c.train.optimizer, "adam");
  EXPECT_TRUE(c.quiet);
  EXPECT_TRUE(parse_train_command({"--help"}).help);
  EXPECT_EQ(parse_train_command({"--learners", "3", "--staleness", "2"}).staleness, 2);
  EXPECT_EQ(parse_train_command({"--learners", "3"}).staleness, 0);
  EXPECT_EQ(parse_train_command({"--learners", "3", "--sync-period", "4"}).sync_period, 4);
  EXPECT_EQ(parse_train_command({"--learners", "3"}).sync_period, 1);
  EXPECT_EQ(parse_train_command({"--learners", "auto", "--lr-scaling", "linear"}).lr_scaling, LrScaling::Linear);
  EXPECT_EQ(parse_train_command({"--learners", "auto", "--lr-scaling", "sqrt"}).lr_scaling, LrScaling::Sqrt);
  EXPECT_EQ(parse_train_command({"--learners", "2", "--lr-scaling", "none"}).lr_scaling, LrScaling::None);
  EXPECT_EQ(parse_train_command({"--learners", "2"}).lr_scaling, LrScaling::None);
  EXPECT_DOUBLE_EQ(parse_train_command({"--weight-decay", "5e-4"}).train.weight_decay, 5e-4);
  EXPECT_DOUBLE_EQ(parse_train_command({}).train.weight_decay, 0.0);
  const TrainCommand decay = parse_train_command({"--lr-drop", "3,5", "--lr-drop-factor", "0.5", "--epochs", "5"});
  EXPECT_EQ(decay.train.lr_drop_epochs, (std::vector<int64_t>{3, 5}));
  EXPECT_DOUBLE_EQ(decay.train.lr_drop_factor, 0.5);
  EXPECT_EQ(parse_train_command({"--lr-drop=2", "--epochs=2"}).train.lr_drop_epochs, (std::vector<int64_t>{2}));
  EXPECT_DOUBLE_EQ(parse_train_command({"--lr-drop", "2", "--epochs", "3"}).train.lr_drop_factor, 0.1);
  EXPECT_TRUE(parse_train_command({}).train.lr_drop_epochs.empty());
  EXPECT_EQ(parse_train_command({"--eval-every", "100"}).train.eval_every, 100);
  EXPECT_EQ(parse_train_command({}).train.eval_every, 0);

  // The executor's and the learners' flags, each landing in its own field.
  c = parse_train_command({"--policy", "fixed", "--inter", "2", "--intra", "3", "--threads", "6", "--momentum", "0.5",
                           "--profile-cache", "none", "--trace", "quiver-test-trace.json"});
  EXPECT_EQ(c.train.policy, "fixed");
  EXPECT_EQ(c.train.inter, 2);
  EXPECT_EQ(c.train.intra, 3);
  EXPECT_DOUBLE_EQ(c.train.momentum, 0.5);
  EXPECT_FALSE(c.explain);
  EXPECT_TRUE(parse_train_command({"--explain"}).explain);
  const TrainCommand with_equals = parse_train_command({"--epochs=3", "--lr=0.05", "--model=lstm"});  // --flag=value
  EXPECT_EQ(with_equals.train.epochs, 3);
  EXPECT_DOUBLE_EQ(with_equals.train.learning_rate, 0.05);
  EXPECT_EQ(with_equals.model, "lstm");
  EXPECT_EQ(c.train.profile_cache, "");
  EXPECT_EQ(c.train.trace_path, "quiver-test-trace.json");
  EXPECT_EQ(parse_train_command({"--profile-cache", "p.json"}).train.profile_cache, "p.json");
  const std::string resume = ::testing::TempDir() + "quiver-test-resume.ckpt";  // --resume must be readable
  std::ofstream(resume) << "x";
  c = parse_train_command({"--learners", "4", "--threads-per-learner", "1", "--threads", "4", "--alpha", "0.25",
                           "--checkpoint", "z.ckpt", "--resume", resume});
  EXPECT_EQ(c.learners, 4);
  EXPECT_FALSE(c.learners_auto);
  EXPECT_EQ(c.threads_per_learner, 1);
  EXPECT_DOUBLE_EQ(c.alpha, 0.25);
  EXPECT_LT(c.mu_z, 0.0);  // not given: SmaOptions' default
  EXPECT_DOUBLE_EQ(parse_train_command({"--learners", "2", "--mu-z", "0"}).mu_z, 0.0);
  EXPECT_DOUBLE_EQ(parse_train_command({"--learners", "auto", "--mu-z", "0.95"}).mu_z, 0.95);
  EXPECT_DOUBLE_EQ(parse_train_command({"--learners", "1", "--alpha", "0.5", "--mu-z", "0.5"}).mu_z, 0.5);  // SMA on
  EXPECT_EQ(c.checkpoint, "z.ckpt");
  EXPECT_EQ(c.resume, resume);
  std::remove(resume.c_str());
  EXPECT_EQ(c.sync, "sma");
  EXPECT_EQ(parse_train_command({"--learners", "2", "--sync", "ssgd"}).sync, "ssgd");
  EXPECT_TRUE(parse_train_command({"--learners", "auto"}).learners_auto);
  EXPECT_EQ(parse_train_command({"--learners", "2", "--trace", "t.json"}).train.trace_path, "t.json");
}

// More threads than cores is allowed when asked for (--threads, or more learners than threads) but
// warned about; the defaults never are.
TEST(TrainOptions, WarnsAboutMoreThreadsThanCores) {
  const std::string over = std::to_string(available_cores() + 1);
  EXPECT_TRUE(parse_train_command({}).warnings.empty());
  EXPECT_TRUE(parse_train_command({"--learners", "auto"}).warnings.empty());
  EXPECT_TRUE(parse_train_command({"--learners", std::to_string(available_cores())}).warnings.empty());
  std::vector<std::string> warnings = parse_train_command({"--threads", over}).warnings;
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(over + " threads on " + std::to_string(available_cores()) + " cores"), std::string::npos)
      << warnings[0];
  warnings = parse_train_command({"--learners", over}).warnings;
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("(" + over + " learners x 1)"), std::string::npos) << warnings[0];
  EXPECT_TRUE(parse_train_command({"--device", "cuda", "--learners", over}).warnings.empty());  // streams, not threads
}

// --alpha 0 is valid (independent learners) but leaves the average model where it started.
// (Counted by content: on one core two learners are also warned about as more threads than cores.)
TEST(TrainOptions, WarnsThatAlphaZeroLeavesTheAverageModelStill) {
  auto alpha_warnings = [](const std::vector<std::string>& args) {
    int count = 0;
    for (const std::string& warning : parse_train_command(args).warnings) count += warning.find("--alpha 0") != std::string::npos;
    return count;
  };
  EXPECT_EQ(alpha_warnings({"--learners", "2", "--alpha", "0"}), 1);
  EXPECT_EQ(alpha_warnings({"--learners", "auto", "--alpha", "0"}), 1);
  // One learner under SMA with alpha 0 trains as plain momentum SGD, but z, which is reported, stays put.
  EXPECT_EQ(alpha_warnings({"--learners", "1", "--alpha", "0"}), 1);
  EXPECT_EQ(alpha_warnings({"--learners", "1"}), 0);  // no SMA at all: z is the learner's model
  EXPECT_EQ(alpha_warnings({"--learners", "2", "--alpha", "0.5"}), 0);
}

TEST(TrainOptions, DeviceAndGpus) {
  EXPECT_EQ(parse_train_command({}).train.device, Device::cpu());
  TrainCommand c = parse_train_command({"--device", "cuda:1", "--learners", "4", "--gpus", "2"});
  EXPECT_EQ(c.train.device, Device::cuda(1));
  EXPECT_EQ(c.gpus, 2);
  EXPECT_TRUE(c.train.device_graphs);
  EXPECT_FALSE(parse_train_command({"--device", "cuda", "--cuda-graphs", "off"}).train.device_graphs);
}

struct BadFlag {
  std::vector<std::string> args;
  std::string flag;
};

void PrintTo(const BadFlag& bad, std::ostream* out) {
  for (const std::string& arg : bad.args) *out << arg << " ";
}

class RejectsBadValue : public ::testing::TestWithParam<BadFlag> {};

TEST_P(RejectsBadValue, NamesTheFlag) {
  try {
    parse_train_command(GetParam().args);
    FAIL() << "accepted a bad value";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(GetParam().flag), std::string::npos) << error.what();
  }
}

// Every bad command line, with what its error must name. A vector for ValuesIn, not ::testing::Values of
// each: Values of 128 arguments instantiates a tuple of 128 elements, which took half of this file's
// compile time (docs/design-notes.md, "Build time").
std::vector<BadFlag> bad_flags() {
  return {
      BadFlag{{"--device", "tpu"}, "--device"}, BadFlag{{"--device", "cuda:x"}, "--device"},
      BadFlag{{"--gpus", "0"}, "--gpus"}, BadFlag{{"--gpus", "2", "--learners", "2"}, "--gpus"},
      BadFlag{{"--device", "cuda", "--gpus", "2"}, "--gpus"},
      BadFlag{{"--device", "cuda", "--learners", "1", "--gpus", "2"}, "--gpus"},
      BadFlag{{"--device", "cuda", "--cuda-graphs", "yes"}, "--cuda-graphs"},
      BadFlag{{"--cuda-graphs", "on"}, "--cuda-graphs"},
      BadFlag{{"--model", "resnet"}, "--model"}, BadFlag{{"--batch", "0"}, "--batch"},
      BadFlag{{"--batch", "abc"}, "--batch"}, BadFlag{{"--batch", "12x"}, "--batch"},
      BadFlag{{"--epochs", "-1"}, "--epochs"}, BadFlag{{"--threads", "0"}, "--threads"},
      BadFlag{{"--lr", "-0.1"}, "--lr"}, BadFlag{{"--lr", "nan"}, "--lr"},
      BadFlag{{"--lr", "fast"}, "--lr"}, BadFlag{{"--max-steps", "-5"}, "--max-steps"}, BadFlag{{"--eval-every", "-1"}, "--eval-every"},
      BadFlag{{"--data", "--quiet"}, "--data"},
      BadFlag{{"--learners", "2", "--explain"}, "--explain"},
      BadFlag{{"--seed", "x"}, "--seed"}, BadFlag{{"--optimizer", "rmsprop"}, "--optimizer"},
      BadFlag{{"--momentum", "1.5"}, "--momentum"}, BadFlag{{"--batch"}, "--batch"},
      BadFlag{{"--frobnicate", "1"}, "--frobnicate"}, BadFlag{{"--policy", "magic"}, "--policy"},
      BadFlag{{"--learners", "0"}, "--learners"}, BadFlag{{"--learners", "many"}, "--learners"},
      BadFlag{{"--alpha", "1.5"}, "--alpha"}, BadFlag{{"--learners", "2", "--mu-z", "1"}, "--mu-z"},
      BadFlag{{"--learners", "2", "--mu-z", "-0.1"}, "--mu-z"}, BadFlag{{"--mu-z", "0.5"}, "--mu-z"},
      BadFlag{{"--learners", "2", "--sync", "ssgd", "--mu-z", "0.5"}, "--mu-z"},
      BadFlag{{"--learners", "1", "--mu-z", "0.5"}, "--mu-z"}, BadFlag{{"--learners", "2", "--sync", "ssgd", "--alpha", "0.5"}, "--alpha"},
      BadFlag{{"--sync", "gossip"}, "--sync"}, BadFlag{{"--threads-per-learner", "2"}, "--threads-per-learner"},
      BadFlag{{"--learners", "4", "--threads-per-learner", "0"}, "--threads-per-learner"},
      BadFlag{{"--learners", "auto", "--threads-per-learner", "1"}, "--threads-per-learner"},
      BadFlag{{"--alpha", "0.5"}, "--alpha"}, BadFlag{{"--checkpoint", "z.ckpt"}, "--checkpoint"},
      BadFlag{{"--learners", "2", "--resume", ""}, "--resume"},
      BadFlag{{"--intra", "2"}, "--intra"}, BadFlag{{"--profile-cache", ""}, "--profile-cache"},
      BadFlag{{"--profile-cache", "/nonexistent/p.json"}, "--profile-cache: directory '/nonexistent' does not exist"},
      BadFlag{{"--profile-cache", "/tmp"}, "--profile-cache: '/tmp' is a directory"},
      BadFlag{{"--profile-cache", "/dev/null"}, "--profile-cache: '/dev/null' is not a regular file"},
      BadFlag{{"--inter", "0"}, "--inter"}, BadFlag{{"--intra", "x"}, "--intra"},
      // The range itself, where no other rule would name the flag first.
      BadFlag{{"--policy", "fixed", "--inter", "0", "--intra", "1"}, "--inter: 0 is out of range [1, 4096]"},
      BadFlag{{"--learners", "2", "--alpha", "1.5"}, "--alpha: must be in [0, 1], got '1.5'"},
      // In range as doubles, not as the kernels' floats.
      BadFlag{{"--momentum", "0.99999999"}, "--momentum: 0.99999999 rounds to 1"},
      BadFlag{{"--learners", "2", "--mu-z", "0.99999999"}, "--mu-z: 0.99999999 rounds to 1"},
      BadFlag{{"--learners", "2", "--alpha", "1e-39"}, "--alpha: 1e-39 is below the smallest normal"},
      BadFlag{{"--momentum", "1e-39"}, "--momentum: 1e-39 is below the smallest normal"},
      BadFlag{{"--staleness", "1"}, "--staleness"},
      BadFlag{{"--lr-scaling", "linear"}, "--lr-scaling"},
      BadFlag{{"--learners", "2", "--lr-scaling", "cubic"}, "--lr-scaling"},
      BadFlag{{"--learners", "2", "--staleness", "-1"}, "--staleness"},
      BadFlag{{"--learners", "2", "--staleness", "65"}, "--staleness"},
      BadFlag{{"--learners", "2", "--sync", "ssgd", "--staleness", "1"}, "--staleness"},
      BadFlag{{"--device", "cuda", "--learners", "2", "--staleness", "1"}, "--staleness"},
      BadFlag{{"--learners", "1", "--staleness", "3"}, "--staleness"},
      BadFlag{{"--weight-decay", "-0.1"}, "--weight-decay: must be a finite number >= 0"},
      BadFlag{{"--weight-decay", "inf"}, "--weight-decay: must be a finite number >= 0"},
      BadFlag{{"--weight-decay", "nan"}, "--weight-decay"},
      BadFlag{{"--weight-decay", "1e300"}, "--weight-decay: 1e300 is out of the range of a 32-bit float"},
      BadFlag{{"--weight-decay", "1e-40"}, "--weight-decay: 1e-40 is out of the range of a 32-bit float"},
      BadFlag{{"--lr-drop", "1"}, "--lr-drop: 1 is out of range [2, 10000]"},
      BadFlag{{"--lr-drop", "3,3"}, "--lr-drop: epochs must rise, got 3 then 3"},
      BadFlag{{"--lr-drop", "2,"}, "--lr-drop: expected an integer, got ''"},
      BadFlag{{"--lr-drop", "two"}, "--lr-drop: expected an integer"},
      BadFlag{{"--lr-drop", "2", "--lr-drop-factor", "0"}, "--lr-drop-factor: must be in (0, 1]"},
      BadFlag{{"--lr-drop", "2", "--lr-drop-factor", "1.5"}, "--lr-drop-factor: must be in (0, 1]"},
      BadFlag{{"--lr-drop", "2", "--lr-drop-factor", "nan"}, "--lr-drop-factor"},
      BadFlag{{"--lr-drop-factor", "0.5"}, "--lr-drop-factor: only with --lr-drop"},
      BadFlag{{"--lr-drop", "5", "--epochs", "2"}, "--lr-drop: epoch 5 is after the last epoch"},
      BadFlag{{"--lr-drop", "2"}, "--lr-drop: epoch 2 is after the last epoch of this run (--epochs 1"},
      BadFlag{{"--lr-drop", "2,3", "--epochs", "3", "--lr-drop-factor", "1e-20"},
              "--lr-drop-factor: 2 drop(s) of 1e-20 take the learning rate to"},
      BadFlag{{"--sync-period", "2"}, "--sync-period"},
      BadFlag{{"--learners", "1", "--sync-period", "2"}, "--sync-period: one learner"},
      BadFlag{{"--learners", "2", "--sync-period", "0"}, "--sync-period"},
      BadFlag{{"--learners", "2", "--sync-period", "1001"}, "--sync-period"},
      BadFlag{{"--learners", "2", "--sync", "ssgd", "--sync-period", "2"}, "--sync-period"},
      BadFlag{{"--learners", "2", "--staleness", "1", "--sync-period", "2"}, "--sync-period"},
      BadFlag{{"--device", "cuda", "--learners", "2", "--sync", "ssgd"}, "--sync"},
      BadFlag{{"--optimizer", "adam", "--momentum", "0.5"}, "--momentum"},
      BadFlag{{"--learners", "2", "--checkpoint", "/nonexistent/dir/z.ckpt"}, "--checkpoint"},
      BadFlag{{"--trace", "/nonexistent/dir/t.json"}, "--trace"}, BadFlag{{"--trace", "/"}, "--trace"},
      BadFlag{{"--trace", ""}, "--trace"},
      BadFlag{{"--learners", "2", "--resume", "/nonexistent/z.ckpt"}, "--resume"},
      BadFlag{{"--learners", "2", "--resume", "/"}, "--resume"},
      BadFlag{{"--learners", "2", "--resume", "/dev/zero"}, "--resume"},
      BadFlag{{"--sync", "sma"}, "--sync"},
      BadFlag{{"--threads", "2", "--policy", "fixed", "--inter", "2", "--intra", "2"}, "--inter 2 x --intra 2"},
      BadFlag{{"--threads", "4", "--learners", "2", "--policy", "fixed", "--inter", "2", "--intra", "2"},
              "each learner's share"},
      BadFlag{{"--learners", "auto", "--policy", "fixed"}, "--policy fixed"},
      BadFlag{{"--device", "cuda", "--explain"}, "--explain"},
      BadFlag{{"--device", "cuda", "--learners", "2", "--threads-per-learner", "1"},
              "--threads-per-learner"},
      BadFlag{{"--threads", "2", "--learners", "2", "--threads-per-learner", "2"},
              "--learners 2 x --threads-per-learner 2 = 4 threads, more than --threads 2"},
      BadFlag{{"--learners", "2", "--sync", "ssgd", "--optimizer", "adam"}, "--sync ssgd"},
      BadFlag{{"--learners", "2", "--alpha", "-0.1"}, "--alpha"},
      BadFlag{{"--learners", "2", "--alpha", "nan"}, "--alpha"},
      BadFlag{{"--learners", "2", "--gpus", "2"}, "--gpus"},
      BadFlag{{"--learners", "257"}, "--learners"},
      // an unknown flag is named as such wherever it stands, with or without a value
      BadFlag{{"--bogus"}, "unknown option '--bogus'"},
      BadFlag{{"--bogus=1"}, "unknown option '--bogus'"},
      BadFlag{{"--epochs", "2", "--bogus"}, "unknown option '--bogus'"},
      BadFlag{{"--quiet=yes"}, "--quiet: takes no value"},
      BadFlag{{"--epochs="}, "--epochs: expected an integer, got ''"},
      // numbers beyond the type are out of range, not "not a number"
      BadFlag{{"--lr", "1e400"}, "--lr: 1e400 is out of range"},
      BadFlag{{"--lr", "1e-320"}, "--lr: 1e-320 is out of range"},
      BadFlag{{"--seed", "99999999999999999999"}, "--seed: 99999999999999999999 is out of range"},
      BadFlag{{"--lr", " 0.1"}, "--lr: expected a number"},
      BadFlag{{"--lr", "0x10"}, "--lr: expected a number"},
      // a double that is 0, subnormal or infinite as the float training computes in
      BadFlag{{"--lr", "1e-50"}, "--lr: 1e-50 is out of the range of a 32-bit float"},
      BadFlag{{"--lr", "1e39"}, "--lr: 1e39 is out of the range of a 32-bit float"},
      BadFlag{{"--policy", "serial", "--explain"}, "--explain"},
      BadFlag{{"--policy", "fixed"}, "--policy fixed: needs --inter"},
      BadFlag{{"--policy", "fixed", "--inter", "1"}, "--policy fixed: needs --inter"},
      BadFlag{{"--threads", "1", "--learners", "2"}, "--learners 2: a thread each at least, more than --threads 1"},
      BadFlag{{"--learners", "2", "--trace", "same.out", "--checkpoint", "same.out"},
              "--trace and --checkpoint: both name 'same.out'"},
      // An output that is one of the data files training reads (the .gz name or the plain one).
      BadFlag{{"--data", ".", "--trace", "train-images-idx3-ubyte.gz"},
              "--trace: 'train-images-idx3-ubyte.gz' is the data file ./train-images-idx3-ubyte.gz"},
      BadFlag{{"--data", ".", "--learners", "2", "--checkpoint", "./t10k-labels-idx1-ubyte"},
              "--checkpoint: './t10k-labels-idx1-ubyte' is the data file"},
      BadFlag{{"--data", ".", "--profile-cache", "t10k-images-idx3-ubyte.gz"}, "--profile-cache: 't10k-images-idx3-ubyte.gz' is the data file"},
      BadFlag{{"--trace", "same.json", "--profile-cache", "./same.json"},
              "--trace and --profile-cache: both name 'same.json'"}};
}

INSTANTIATE_TEST_SUITE_P(
    Flags, RejectsBadValue, ::testing::ValuesIn(bad_flags()),
    [](const ::testing::TestParamInfo<BadFlag>& info) {
      std::string name = std::to_string(info.index);
      for (const std::string& arg : info.param.args)
        for (char ch : arg) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return name;
    });

// The progress line's ETA: minutes and seconds, rounded; an ETA past an int's seconds (a first
// step timed while profiling, 6x10^8 steps ahead) once wrapped to a negative time.
TEST(TrainOptions, TheProgressLinesEtaIsMinutesAndSecondsWithoutWrapping) {
  EXPECT_EQ(clock_text(0.0), "0:00");
  EXPECT_EQ(clock_text(7.4), "0:07");
  EXPECT_EQ(clock_text(725.0), "12:05");
  EXPECT_EQ(clock_text(3599.6), "60:00");
  EXPECT_EQ(clock_text(2.4e9), ">16666666:40");
  EXPECT_EQ(clock_text(-1.0), "0:00");
  EXPECT_EQ(clock_text(std::numeric_limits<double>::quiet_NaN()), "0:00");
}

}  // namespace
}  // namespace quiver
