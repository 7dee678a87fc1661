// Learners and SMA: SMA against a hand-computed 2-learner example, one learner with alpha 0
// against plain momentum SGD, reproducibility, convergence of several learners, bad options.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "models/models.h"
#include "runtime/cpu_stream.h"
#include "runtime/learners.h"
#include "runtime/sma.h"

namespace quiver {
namespace {

Tensor flat(std::vector<float> values) {
  Tensor t = Tensor::zeros(Shape{static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.f32());
  return t;
}

void expect_values(const Tensor& t, std::vector<float> expected, const char* what) {
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(t.f32()[i], expected[i], 1e-6) << what << "[" << i << "]";
}

// Worked by hand from DESIGN.md's rule, alpha 0.5, mu_z 0.9, z starting at (1, 2, 3).
TEST(Sma, MatchesAHandComputedTwoLearnerExample) {
  Tensor z = flat({1, 2, 3});
  SmaSync sma(z, 2, SmaOptions{0.5, 0.9});
  // Round 1: snapshots (0.5, 2.5, 3) and (1.5, 1, 3.5); the local steps moved each by +-0.1.
  Tensor w1 = flat({0.4f, 2.6f, 2.9f}), w2 = flat({1.6f, 0.9f, 3.6f});
  Tensor s1 = flat({0.5f, 2.5f, 3.0f}), s2 = flat({1.5f, 1.0f, 3.5f});
  std::vector<Tensor> params{w1, w2}, snapshots{s1, s2};
  sma.round(params, snapshots);
  // c1 = 0.5 (s1 - z) = (-0.25, 0.25, 0); c2 = (0.25, -0.5, 0.25); d = (0, -0.25, 0.25).
  expect_values(w1, {0.65f, 2.35f, 2.9f}, "w1");
  expect_values(w2, {1.35f, 1.4f, 3.35f}, "w2");
  expect_values(z, {1.0f, 1.75f, 3.25f}, "z");
  // Round 2: no local movement (w = s); the average's momentum carries 0.9 of the last move.
  Tensor t1 = flat({0.65f, 2.35f, 2.9f}), t2 = flat({1.35f, 1.4f, 3.35f});
  std::vector<Tensor> params2{w1, w2}, snapshots2{t1, t2};
  sma.round(params2, snapshots2);
  // c1 = (-0.175, 0.3, -0.175); c2 = (0.175, -0.175, 0.05); d = (0, 0.125, -0.125) + 0.9 (0, -0.25, 0.25).
  expect_values(z, {1.0f, 1.65f, 3.35f}, "z after round 2");
  expect_values(w1, {0.825f, 2.05f, 3.075f}, "w1 after round 2");
  expect_values(w2, {1.175f, 1.575f, 3.3f}, "w2 after round 2");
  sma.reset_replicas(params2);
  expect_values(w1, {1.0f, 1.65f, 3.35f}, "w1 after reset");
}

TEST(Sma, RejectsBadOptions) {
  Tensor z = flat({1, 2});
  EXPECT_THROW(SmaSync(z, 0, SmaOptions{}), Error);
  EXPECT_THROW(SmaSync(z, 2, SmaOptions{1.5, 0.9}), Error);
  EXPECT_THROW(SmaSync(z, 2, SmaOptions{0.5, 1.0}), Error);
  EXPECT_DOUBLE_EQ(SmaSync(z, 4, SmaOptions{}).alpha(), 0.25);  // default: 1/k
  SmaSync sma(z, 2, SmaOptions{});
  Tensor w = flat({1, 2, 3});
  std::vector<Tensor> params{w, w}, snapshots{w};
  EXPECT_THROW(sma.round(params, snapshots), Error);
}

struct Batches {
  explicit Batches(int64_t samples, int seed = 5) : images(samples * 784), labels(samples) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    for (float& v : images) v = pixel(rng);
    for (int32_t& l : labels) l = static_cast<int32_t>(rng() % 10);
  }
  std::vector<float> images;
  std::vector<int32_t> labels;
};

TrainOptions recipe() {
  TrainOptions train;
  train.batch = 8;
  train.eval_batch = 8;
  train.policy = "serial";
  train.threads = 1;
  return train;
}

// k = 1 and alpha = 0: SMA changes nothing, so the learner is plain momentum SGD, bit for bit.
TEST(Learners, OneLearnerWithAlphaZeroIsPlainMomentumSgd) {
  Batches data(8);
  LearnerGroup group(models::mlp(), recipe(), LearnerOptions{1, 1, SmaOptions{0.0, 0.9}});
  Trainer plain(models::mlp(), recipe());
  for (int step = 0; step < 10; ++step) {
    group.round(data.images.data(), data.labels.data());
    plain.train_step(data.images.data(), data.labels.data());
  }
  const Tensor& a = group.replica(0).flat_params();
  const Tensor& b = plain.params().flat_params();
  ASSERT_EQ(a.numel(), b.numel());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.f32()[i], b.f32()[i]) << "parameter " << i;
}

// One learner with the default alpha has nothing to average: it is single-stream training, and z
// (what is evaluated and checkpointed) is its model, bit for bit; a second learner then starts from it.
TEST(Learners, OneLearnerWithDefaultAlphaIsSingleStreamTraining) {
  Batches data(2 * 8);
  LearnerGroup group(models::mlp(), recipe(), LearnerOptions{1, 1, SmaOptions{}});
  Trainer plain(models::mlp(), recipe());
  for (int step = 0; step < 10; ++step) {
    group.round(data.images.data(), data.labels.data());
    plain.train_step(data.images.data(), data.labels.data());
  }
  const Tensor& z = group.average();
  const Tensor& w = plain.params().flat_params();
  for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(z.f32()[i], w.f32()[i]) << "parameter " << i;
  group.resize(2, 1);
  for (int j = 0; j < 2; ++j)
    for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(group.replica(j).flat_params().f32()[i], w.f32()[i]);
}

TEST(Learners, FixedSeedAndScheduleAreReproducible) {
  Batches data(3 * 8);
  std::vector<float> first;
  for (int trial = 0; trial < 2; ++trial) {
    LearnerGroup group(models::mlp(), recipe(), LearnerOptions{3, 1, SmaOptions{}});
    for (int round = 0; round < 5; ++round) group.round(data.images.data(), data.labels.data());
    const Tensor& z = group.average();
    std::vector<float> values(z.f32(), z.f32() + z.numel());
    if (trial == 0)
      first = values;
    else
      EXPECT_EQ(values, first);
  }
}

// A round given one batch pointer per learner (what fit() does: no gathering copy) trains exactly
// like a round over one contiguous buffer; a wrong number of batches is refused.
TEST(Learners, PerLearnerBatchesEqualOneContiguousBuffer) {
  Batches data(3 * 8);
  LearnerGroup contiguous(models::mlp(), recipe(), LearnerOptions{3, 1, SmaOptions{}});
  LearnerGroup separate(models::mlp(), recipe(), LearnerOptions{3, 1, SmaOptions{}});
  std::vector<std::vector<float>> images;
  std::vector<std::vector<int32_t>> labels;
  for (int j = 2; j >= 0; --j) {  // separate allocations, filled out of order
    images.insert(images.begin(), std::vector<float>(data.images.begin() + j * 8 * 784,
                                                     data.images.begin() + (j + 1) * 8 * 784));
    labels.insert(labels.begin(),
                  std::vector<int32_t>(data.labels.begin() + j * 8, data.labels.begin() + (j + 1) * 8));
  }
  std::vector<const float*> image_batches;
  std::vector<const int32_t*> label_batches;
  for (int j = 0; j < 3; ++j) image_batches.push_back(images[j].data()), label_batches.push_back(labels[j].data());
  for (int round = 0; round < 4; ++round)
    EXPECT_EQ(separate.round(image_batches, label_batches), contiguous.round(data.images.data(), data.labels.data()));
  const Tensor &a = separate.average(), &b = contiguous.average();
  EXPECT_EQ(std::vector<float>(a.f32(), a.f32() + a.numel()), std::vector<float>(b.f32(), b.f32() + b.numel()));
  image_batches.pop_back();
  EXPECT_THROW(separate.round(image_batches, label_batches), Error);
}

// Two learners on different batches of a small fixed problem: the learners' loss falls far below
// its start, and the average model z classifies the training samples well above chance.
TEST(Learners, SeveralLearnersConverge) {
  Batches data(2 * 8, 11);
  TrainOptions train = recipe();
  train.learning_rate = 0.05;
  LearnerGroup group(models::mlp(), train, LearnerOptions{2, 1, SmaOptions{}});
  const double start = group.round(data.images.data(), data.labels.data());
  double loss = start;
  for (int round = 0; round < 150; ++round) loss = group.round(data.images.data(), data.labels.data());
  EXPECT_LT(loss, 0.2 * start);
  Dataset samples;
  samples.count = 16, samples.rows = 28, samples.cols = 28;
  samples.images = data.images;
  samples.labels = data.labels;
  EXPECT_GT(group.evaluate(samples), 0.8);
}

TEST(Learners, ErrorsAreClear) {
  EXPECT_THROW(LearnerGroup(models::mlp(), recipe(), LearnerOptions{0, 1, SmaOptions{}}), Error);
  EXPECT_THROW(LearnerGroup(models::mlp(), recipe(), LearnerOptions{2, 0, SmaOptions{}}), Error);
  // More learners per GPU than a device's SMA round takes are refused before any device is
  // touched (so this holds on a machine without one, too).
  TrainOptions on_gpu = recipe();
  on_gpu.device = Device::cuda(0);
  try {
    LearnerGroup group(models::mlp(), on_gpu, LearnerOptions{kMaxLearnersPerDevice + 1, 1, SmaOptions{}});
    FAIL() << "more learners than one GPU's SMA round takes";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("per GPU"), std::string::npos) << error.what();
  }
  LearnerOptions negative_warmup{1, 1, SmaOptions{}};
  negative_warmup.tune_warmup_seconds = -1.0;
  EXPECT_THROW(LearnerGroup(models::mlp(), recipe(), negative_warmup), Error);
  // A learner's NaN loss reaches the caller, naming the step.
  Batches data(2 * 8);
  TrainOptions train = recipe();
  train.learning_rate = 1e30;
  LearnerGroup group(models::mlp(), train, LearnerOptions{2, 1, SmaOptions{}});
  try {
    for (int round = 0; round < 10; ++round) group.round(data.images.data(), data.labels.data());
    FAIL() << "a diverging run must stop";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("at step"), std::string::npos) << error.what();
  }
}

TEST(CpuStream, RunsWorkInOrderAndRethrows) {
  CpuStream stream;
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) stream.submit([&order, i] { order.push_back(i); });
  stream.wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  stream.submit([] { throw Error("deliberate"); });
  EXPECT_THROW(stream.wait(), Error);
  stream.submit([&order] { order.push_back(5); });
  EXPECT_NO_THROW(stream.wait());  // usable after an error
  EXPECT_EQ(order.size(), 6u);
}

}  // namespace
}  // namespace quiver

namespace quiver {
namespace {

Dataset small_dataset(int64_t count, int seed) {
  Batches data(count, seed);
  Dataset set;
  set.count = count, set.rows = 28, set.cols = 28;
  set.images = data.images;
  set.labels = data.labels;
  return set;
}

// fit() with the tuner: it measures one learner first, then adds learners while the gain is
// large enough, and keeps one of the configurations it measured; training continues throughout.
TEST(Learners, TunerMeasuresAndKeepsAMeasuredConfiguration) {
  Dataset train = small_dataset(8 * 64, 3);
  LearnerOptions options{1, 1, SmaOptions{}};
  options.tune = true;
  options.tune_window = 3;
  options.tune_window_seconds = 0.0;
  options.tune_warmup_seconds = 0.0;
  options.max_learners = 3;
  LearnerGroup group(models::mlp(), recipe(), options);
  TrainReport report = group.fit(train, nullptr, 3);
  const std::vector<TunerStep>& history = group.tuner_history();
  ASSERT_GE(history.size(), 2u);
  EXPECT_EQ(history.front().learners, 1);
  EXPECT_EQ(history.front().threads_per_learner, available_cores());
  const TunerStep& chosen = history.back();
  bool measured = false;
  for (size_t i = 0; i + 1 < history.size(); ++i) {
    EXPECT_EQ(history[i].learners, static_cast<int>(i) + 1);  // one more learner each time
    EXPECT_GT(history[i].samples_per_second, 0.0);
    measured = measured || (history[i].learners == chosen.learners &&
                            history[i].samples_per_second == chosen.samples_per_second);
  }
  EXPECT_TRUE(measured);
  EXPECT_EQ(group.learners(), chosen.learners);
  EXPECT_GT(report.steps, 0);
}

TEST(Learners, TooManyLearnersForMemoryAreRefusedBeforeTraining) {
  TrainOptions train = recipe();
  train.batch = 512;
  try {
    LearnerGroup group(models::mlp(), train, LearnerOptions{1000000, 1, SmaOptions{}});
    FAIL() << "a million replicas cannot fit";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("MiB are available"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace quiver

#include <filesystem>
#include <fstream>

namespace quiver {
namespace {

std::string checkpoint_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("quiver_ckpt_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(Checkpoint, RoundTripIsExactAndResumeContinuesTheLossCurve) {
  Batches data(2 * 8, 21);
  TrainOptions train = recipe();
  train.learning_rate = 0.05;
  const std::string path = checkpoint_path("roundtrip");
  double start = 0.0, before_save = 0.0;
  std::vector<float> saved;
  {
    LearnerGroup group(models::mlp(), train, LearnerOptions{2, 1, SmaOptions{}});
    start = group.round(data.images.data(), data.labels.data());
    for (int round = 0; round < 60; ++round) before_save = group.round(data.images.data(), data.labels.data());
    group.save(path);
    saved.assign(group.average().f32(), group.average().f32() + group.average().numel());
  }
  LearnerGroup resumed(models::mlp(), train, LearnerOptions{2, 1, SmaOptions{}});
  resumed.load(path);
  const Tensor& z = resumed.average();
  ASSERT_EQ(static_cast<size_t>(z.numel()), saved.size());
  for (size_t i = 0; i < saved.size(); ++i) ASSERT_EQ(z.f32()[i], saved[i]) << "parameter " << i;
  for (int j = 0; j < 2; ++j)  // every replica restarts from z
    for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(resumed.replica(j).flat_params().f32()[i], z.f32()[i]);
  EXPECT_EQ(resumed.rounds_done(), 61);
  const double after = resumed.round(data.images.data(), data.labels.data());
  EXPECT_LT(after, 0.5 * start) << "the resumed run starts near where the saved one stopped, not from scratch";
  EXPECT_LT(after, 2.0 * before_save + 0.05);
  std::filesystem::remove(path);
}

TEST(Checkpoint, CorruptTruncatedAndForeignFilesAreRejectedClearly) {
  const std::string path = checkpoint_path("bad");
  LearnerGroup group(models::mlp(), recipe(), LearnerOptions{1, 1, SmaOptions{}});
  group.save(path);
  const std::vector<float> before(group.average().f32(), group.average().f32() + group.average().numel());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto expect_rejected = [&](const std::string& content, const std::string& word) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
    try {
      group.load(path);
      FAIL() << "expected a rejection mentioning '" << word << "'";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(word), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
    }
    for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(group.average().f32()[i], before[i]) << "nothing is lost";
  };
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x40;
  expect_rejected(flipped, "checksum");
  expect_rejected(bytes.substr(0, bytes.size() - 100), "truncated");
  expect_rejected("not a checkpoint", "magic");
  {
    LearnerGroup cnn(models::cnn(), recipe(), LearnerOptions{1, 1, SmaOptions{}});
    cnn.save(path);
  }
  std::ifstream in(path, std::ios::binary);
  std::string cnn_bytes(std::istreambuf_iterator<char>(in), {});
  expect_rejected(cnn_bytes, "holds model 'cnn', not 'mlp'");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace quiver

namespace quiver {
namespace {

// Synchronous SGD: k learners of batch b average their gradients and apply one momentum SGD
// step, which is one learner of batch k*b (the loss is a batch mean) up to float rounding.
TEST(Learners, SynchronousSgdEqualsOneLearnerOfTheCombinedBatch) {
  Batches data(3 * 8, 31);
  LearnerOptions options{3, 1, SmaOptions{}};
  options.sync = Sync::Ssgd;
  LearnerGroup group(models::mlp(), recipe(), options);
  TrainOptions big = recipe();
  big.batch = 24;
  big.eval_batch = 24;
  Trainer single(models::mlp(), big);
  for (int step = 0; step < 5; ++step) {
    const double group_loss = group.round(data.images.data(), data.labels.data());
    const double single_loss = single.train_step(data.images.data(), data.labels.data());
    EXPECT_NEAR(group_loss, single_loss, 1e-5 * std::abs(single_loss)) << "step " << step;
  }
  const Tensor& z = group.average();
  const Tensor& w = single.params().flat_params();
  ASSERT_EQ(z.numel(), w.numel());
  for (int64_t i = 0; i < z.numel(); ++i) ASSERT_NEAR(z.f32()[i], w.f32()[i], 1e-5 * std::abs(w.f32()[i]) + 1e-6) << i;
  for (int j = 0; j < 3; ++j)  // every learner holds the one model
    for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(group.replica(j).flat_params().f32()[i], z.f32()[i]);
}

TEST(Learners, SynchronousSgdNeedsSgd) {
  TrainOptions adam = recipe();
  adam.optimizer = "adam";
  LearnerOptions options{2, 1, SmaOptions{}};
  options.sync = Sync::Ssgd;
  EXPECT_THROW(LearnerGroup(models::mlp(), adam, options), Error);
}

}  // namespace
}  // namespace quiver
