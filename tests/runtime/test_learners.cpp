// Learners: one learner with alpha 0 against plain momentum SGD, two learners against plain SGD
// steps and the textbook SMA round for each model, reproducibility, convergence of several
// learners, a sync period, bad options, the tuner, memory checks and synchronous SGD. The
// learning rate (scaling rules, drops, the step decay): test_learner_rates.cpp. The staleness
// bound: test_learner_staleness.cpp. SmaSync itself: test_sma.cpp. Checkpoints: test_checkpoint.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <thread>

#include <unistd.h>

#include "core/error.h"
#include "models/models.h"
#include "runtime/cpu_stream.h"
#include "runtime/learners.h"
#include "runtime/sma.h"
#include "tests/error_of.h"
#include "tests/runtime/learner_test_data.h"

namespace quiver {
namespace {

using learner_test::Batches;
using learner_test::copy_of;
using learner_test::PlainPair;
using learner_test::recipe;
using learner_test::rounds_in_lockstep;
using learner_test::small_dataset;
using learner_test::stale;
using learner_test::step_named;
using learner_test::two_syncing_every;

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

// For each bundled model, three rounds of two CPU learners with momentum SGD follow the textbook
// rule: two plain trainers, each stepping from a snapshot of its parameters, then SmaSync::round()
// over the parameters and the snapshots. The group recovers each snapshot from the velocity
// (s = w - v, after the step), which rounds differently in the last bits: within 1e-6 (measured:
// at most 1.5e-8).
TEST(Learners, SmaRoundsEqualPlainSgdStepsAndTheTextbookRound) {
  for (const ModelSpec& model : {models::mlp(), models::cnn(), models::lstm()}) {
    Batches data(2 * 8, 23);
    LearnerGroup group(model, recipe(), LearnerOptions{2, 1, SmaOptions{0.5, 0.9}});
    PlainPair plain(model);
    Tensor z = copy_of(group.average());
    SmaSync textbook(z, 2, SmaOptions{0.5, 0.9});
    rounds_in_lockstep(group, plain, textbook, data, 3);
    const Tensor& average = group.average();
    ASSERT_EQ(average.numel(), z.numel());
    double moved = 0.0;
    for (int64_t i = 0; i < z.numel(); ++i) {
      ASSERT_NEAR(average.f32()[i], z.f32()[i], 1e-6) << model.name << ": z[" << i << "]";
      for (int j = 0; j < 2; ++j)
        ASSERT_NEAR(group.replica(j).flat_params().f32()[i], plain.w(j).f32()[i], 1e-6)
            << model.name << ": w" << j << "[" << i << "]";
      moved += std::abs(z.f32()[i] - plain.w(0).f32()[i]);
    }
    EXPECT_GT(moved, 0.0) << model.name << ": the replicas never left z";
  }
}

// Under a sync period of 3, rounds 1-2 and 4-5 are the learners' own steps, and rounds 3 and 6 end
// with the textbook round over each replica's snapshot from before that round's step: the same
// plain trainers and SmaSync::round(), applied every third round only. With momentum SGD the
// group recovers the snapshot from the velocity; with Adam it copies one before a sync round's step.
TEST(Learners, ASyncPeriodAveragesEveryNthRoundOnly) {
  TrainOptions adam = recipe();
  adam.optimizer = "adam";
  adam.learning_rate = 1e-3;
  for (const auto& [model, train] : {std::pair{models::mlp(), recipe()}, std::pair{models::lstm(), recipe()},
                                     std::pair{models::mlp(), adam}}) {
    SCOPED_TRACE(model.name + ", " + train.optimizer);
    Batches data(2 * 8, 29);
    LearnerGroup group(model, train, two_syncing_every(3));
    PlainPair plain(model, train);
    Tensor z = copy_of(group.average());
    const Tensor start = copy_of(z);
    SmaSync textbook(z, 2, SmaOptions{0.5, 0.9});
    for (int round = 1; round <= 6; ++round) {
      group.round(data.images.data(), data.labels.data());
      plain.step(data);
      if (round % 3 == 0) textbook.round(plain.params, plain.snapshots);
      // Between sync rounds z stays where the last one left it.
      const Tensor& average = group.average();
      for (int64_t i = 0; i < z.numel(); ++i)
        ASSERT_NEAR(average.f32()[i], z.f32()[i], 1e-6) << model.name << ", round " << round << ": z[" << i << "]";
      for (int j = 0; j < 2; ++j)
        for (int64_t i = 0; i < z.numel(); ++i)
          ASSERT_NEAR(group.replica(j).flat_params().f32()[i], plain.w(j).f32()[i], 1e-6)
              << model.name << ", round " << round << ": w" << j << "[" << i << "]";
    }
    // z moved twice, and differs from a replica (a sync period that skipped every SMA would leave z
    // at its start; one that never corrected would leave the replicas apart from the textbook's).
    double moved = 0.0, apart = 0.0;
    for (int64_t i = 0; i < z.numel(); ++i) {
      moved += std::abs(z.f32()[i] - start.f32()[i]);
      apart += std::abs(z.f32()[i] - plain.w(0).f32()[i]);
    }
    EXPECT_GT(moved, 0.0) << model.name << ": z never moved";
    EXPECT_GT(apart, 0.0) << model.name;
  }
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

// The same seed and schedule give the same z, bit for bit; and the comparison means something: z
// moved from its start, and another seed gives another z.
TEST(Learners, FixedSeedAndScheduleAreReproducible) {
  Batches data(3 * 8);
  auto train = [&](uint64_t seed) {
    TrainOptions options = recipe();
    options.seed = seed;
    LearnerGroup group(models::mlp(), options, LearnerOptions{3, 1, SmaOptions{}});
    const Tensor& start = group.average();
    std::vector<float> initial(start.f32(), start.f32() + start.numel());
    for (int round = 0; round < 5; ++round) group.round(data.images.data(), data.labels.data());
    const Tensor& z = group.average();
    return std::make_pair(initial, std::vector<float>(z.f32(), z.f32() + z.numel()));
  };
  const auto [initial, first] = train(5);
  EXPECT_EQ(train(5).second, first);
  EXPECT_NE(first, initial) << "training moved nothing";
  EXPECT_NE(train(6).second, first) << "another seed, the same model";
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
  const Dataset samples = small_dataset(16, 11);  // data's samples
  EXPECT_GT(group.evaluate(samples), 0.8);
}

// The learners' fit() evaluates z every N batches (every learner's count; a round adds k) and
// after each epoch, and stops where the callback says.
TEST(Learners, EvaluateEveryNBatchesAndStopThere) {
  const Dataset train = small_dataset(80, 5), test = small_dataset(16, 6);  // 10 batches of 8 an epoch
  TrainOptions options = recipe();
  options.eval_every = 3;
  LearnerGroup group(models::mlp(), options, LearnerOptions{2, 1, SmaOptions{}});
  std::vector<int64_t> batches;
  double last = -1.0;
  group.on_evaluation([&](const Evaluation& e) {
    batches.push_back(e.batches);
    last = e.test_accuracy;
    return e.batches < 6;
  });
  const TrainReport report = group.fit(train, &test, 2);
  EXPECT_EQ(batches, (std::vector<int64_t>{4, 6}));  // rounds end at 2, 4, 6: multiples of 3 passed at 4 and 6
  EXPECT_EQ(report.steps, 3) << "rounds";
  ASSERT_EQ(report.epochs.size(), 1u);
  EXPECT_EQ(report.epochs[0].test_accuracy, last);
  EXPECT_EQ(group.evaluate(test), last);
}

// An epoch is one pass over the data whatever k: the batches a round of k cannot take at an
// epoch's end are dropped, and a second fit() (or a resumed run) continues with the next epoch's
// order. So two epochs in one fit() and one epoch in each of two fit() calls train the same
// batches in the same order (synchronous rounds are reproducible bit for bit).
TEST(Learners, EachEpochIsOnePassAndASecondFitContinuesTheOrder) {
  const Dataset train = small_dataset(40, 7);  // 5 batches of 8 an epoch: 2 learners leave one
  LearnerGroup together(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
  const TrainReport both = together.fit(train, nullptr, 2);
  EXPECT_EQ(both.steps, 4) << "2 rounds an epoch";
  LearnerGroup apart(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
  apart.fit(train, nullptr, 1);
  apart.fit(train, nullptr, 1);
  const Tensor &a = together.average(), &b = apart.average();
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.f32()[i], b.f32()[i]) << "parameter " << i;
  EXPECT_EQ(together.epochs_done(), 2);
  // An epoch cut short does not count: the next fit() starts that epoch's order again.
  LearnerGroup cut(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
  cut.fit(train, nullptr, 1, /*max_rounds=*/1);
  EXPECT_EQ(cut.epochs_done(), 0);
  cut.fit(train, nullptr, 1);
  EXPECT_EQ(cut.epochs_done(), 1);
}

// The progress counts the batches rounds can take: 3 learners over 5 batches an epoch train 3
// (one round), so the last report reads 3 of 3 and, over two epochs, 6 of 6 (it read 3 of 5
// and 6 of 10, never reaching its total).
TEST(Learners, ProgressCountsTheBatchesRoundsTake) {
  const Dataset train = small_dataset(40, 7);  // 5 batches of 8
  LearnerGroup group(models::mlp(), recipe(), LearnerOptions{3, 1, SmaOptions{}});
  std::vector<Progress> reports;
  group.on_progress([&](const Progress& p) { reports.push_back(p); });
  const TrainReport report = group.fit(train, nullptr, 2);
  EXPECT_EQ(report.steps, 2);
  ASSERT_FALSE(reports.empty());
  for (const Progress& p : reports) {
    EXPECT_EQ(p.steps_in_epoch, 3);
    EXPECT_EQ(p.total_steps, 6);
  }
  EXPECT_EQ(reports.back().step, 3);
  EXPECT_EQ(reports.back().global_step, 6);
  EXPECT_TRUE(reports.back().last);
}

// fit() from one of its own callbacks is refused (it trained on, and the outer fit() went on
// with its own epoch numbers and learning rate after it); the group stays usable.
TEST(Learners, FitFromItsOwnCallbackIsRefused) {
  const Dataset train = small_dataset(40, 7);
  LearnerGroup group(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
  group.on_epoch([&](const EpochReport&) {
    group.fit(train, nullptr, 1);
    return true;
  });
  EXPECT_NE(test::error_of([&] { group.fit(train, nullptr, 2); }).find("fit() called from one of its own callbacks"),
            std::string::npos);
  EXPECT_EQ(group.epochs_done(), 1);
  // So is a load (fit() went on counting its own rounds over the loaded ones); a save is fine.
  const std::string path =
      (std::filesystem::temp_directory_path() / cat("quiver-callback-load-", ::getpid(), ".ckpt")).string();
  group.save(path);
  group.on_epoch([&](const EpochReport&) {
    group.save(path);
    group.load(path);
    return true;
  });
  EXPECT_NE(test::error_of([&] { group.fit(train, nullptr, 1); }).find("load() called from a fit() callback"),
            std::string::npos);
  std::filesystem::remove(path);
  EXPECT_EQ(group.epochs_done(), 2);
  group.on_epoch(nullptr);
  EXPECT_EQ(group.fit(train, nullptr, 1).steps, 2);
  EXPECT_EQ(group.epochs_done(), 3);
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
  // A sync period: at least one round, SMA's only, not with a staleness bound.
  auto period_error = [](int sync_period, int staleness, Sync sync) {
    LearnerOptions period{2, 1, SmaOptions{}};
    period.sync_period = sync_period, period.staleness = staleness, period.sync = sync;
    try {
      LearnerGroup group(models::mlp(), recipe(), period);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(period_error(0, 0, Sync::Sma), "sync period: must be in [1, 1000] rounds, got 0");
  EXPECT_EQ(period_error(kMaxSyncPeriod + 1, 0, Sync::Sma), "sync period: must be in [1, 1000] rounds, got 1001");
  EXPECT_NE(period_error(2, 1, Sync::Sma).find("sync period: a staleness bound"), std::string::npos);
  EXPECT_NE(period_error(2, 0, Sync::Ssgd).find("sync period: synchronous SGD"), std::string::npos);
  EXPECT_EQ(period_error(2, 0, Sync::Sma), "no error");
  LearnerOptions negative_warmup{1, 1, SmaOptions{}};
  negative_warmup.tune_warmup_seconds = -1.0;
  EXPECT_THROW(LearnerGroup(models::mlp(), recipe(), negative_warmup), Error);
  // Windows that never end: the tuner would never settle.
  LearnerOptions endless_window{1, 1, SmaOptions{}}, endless_warmup = endless_window;
  endless_window.tune_window_seconds = std::numeric_limits<double>::infinity();
  endless_warmup.tune_warmup_seconds = std::numeric_limits<double>::infinity();
  EXPECT_THROW(LearnerGroup(models::mlp(), recipe(), endless_window), Error);
  EXPECT_THROW(LearnerGroup(models::mlp(), recipe(), endless_warmup), Error);
  // fit()'s own counts, and learners that do not exist: quiver::Errors, not silence or out_of_range.
  LearnerGroup small(models::mlp(), recipe(), LearnerOptions{1, 1, SmaOptions{}});
  const Dataset eight = small_dataset(8, 1);
  EXPECT_THROW(small.fit(eight, nullptr, 1, -1), Error);
  EXPECT_THROW(small.fit(eight, nullptr, kMostEpochs + 1), Error);
  EXPECT_EQ(small.rounds_done(), 0);
  EXPECT_THROW(small.replica(1), Error);
  EXPECT_THROW(small.learner_executor(-1), Error);
  // On the CPU the tuner tries no more learners than the cores it splits: an explicit ceiling
  // above them is refused; at the cores, or without tuning, it is not.
  LearnerOptions crowded{1, 1, SmaOptions{}};
  crowded.tune = true;
  crowded.tune_cores = 2;
  crowded.max_learners = 3;
  try {
    LearnerGroup group(models::mlp(), recipe(), crowded);
    FAIL() << "a tuner ceiling above its cores";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("max learners 3 is more than the 2 cores the tuner splits"),
              std::string::npos)
        << error.what();
  }
  crowded.max_learners = 2;
  EXPECT_NO_THROW(LearnerGroup(models::mlp(), recipe(), crowded));
  crowded.tune_cores = 0;  // all the host's cores
  crowded.max_learners = available_cores() + 1;
  EXPECT_THROW(LearnerGroup(models::mlp(), recipe(), crowded), Error);
  crowded.tune = false;
  EXPECT_NO_THROW(LearnerGroup(models::mlp(), recipe(), crowded));
  // A learner's NaN loss reaches the caller, naming the step.
  Batches data(2 * 8);
  TrainOptions train = recipe();
  train.learning_rate = 1e30;
  LearnerGroup group(models::mlp(), train, LearnerOptions{2, 1, SmaOptions{}});
  int rounds = 0;
  try {
    for (; rounds < 10; ++rounds) group.round(data.images.data(), data.labels.data());
    FAIL() << "a diverging run must stop";
  } catch (const Error& error) {
    const int64_t step = step_named(error);
    EXPECT_GE(step, 1) << error.what();
    EXPECT_LE(step, rounds + 1) << error.what();  // a step of the round that failed, or before
  }
  // A round takes one batch per learner from one epoch: a round larger than the epoch is refused.
  LearnerGroup wide(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
  try {
    wide.fit(small_dataset(12, 1), nullptr, 1);
    FAIL() << "an epoch of 1 batch cannot feed 2 learners";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("2 learners of batch 8 need 16 samples a round; the training set has 12"),
              std::string::npos)
        << error.what();
  }
  // So is one that a callback grew past the epoch's batches (5 learners, 4 batches an epoch): the
  // next epoch is refused, not counted done with nothing trained (three were, without a word).
  LearnerGroup grown(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
  grown.on_epoch([&](const EpochReport&) {
    grown.resize(5, 1);
    return true;
  });
  try {
    grown.fit(small_dataset(32, 1), nullptr, 4);
    FAIL() << "an epoch of 4 batches cannot feed 5 learners";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("5 learners of batch 8 need 40 samples a round; the training set has 32"),
              std::string::npos)
        << error.what();
  }
  EXPECT_EQ(grown.epochs_done(), 1);
  EXPECT_EQ(grown.rounds_done(), 2);
}

// One learner's step fails (a NaN in its batch) while the other's succeeds: the round ends with
// that learner's error instead of leaving the other waiting where the learners meet for SMA, no
// SMA is applied (z is what it was; the failed replica's update is not averaged into it).
TEST(Learners, OneLearnerFailingItsStepEndsTheRoundWithoutSma) {
  for (int failing : {0, 1}) {
    Batches data(2 * 8);
    LearnerGroup group(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
    group.round(data.images.data(), data.labels.data());
    const Tensor before = copy_of(group.average());
    std::vector<float> poisoned(data.images.begin() + failing * 8 * 784, data.images.begin() + (failing + 1) * 8 * 784);
    poisoned[5] = std::numeric_limits<float>::quiet_NaN();
    std::vector<const float*> images{data.images.data(), data.images.data() + 8 * 784};
    images[failing] = poisoned.data();
    const std::vector<const int32_t*> labels{data.labels.data(), data.labels.data() + 8};
    try {
      group.round(images, labels);
      FAIL() << "learner " << failing << "'s NaN must stop the round";
    } catch (const Error& error) {  // named: which learner, which round, and its own step
      EXPECT_NE(std::string(error.what()).find(cat("learner ", failing, ", round 2: training stopped: loss is nan at step 2")),
                std::string::npos)
          << error.what();
    }
    const Tensor& after = group.average();
    for (int64_t i = 0; i < after.numel(); ++i) ASSERT_EQ(after.f32()[i], before.f32()[i]) << "z[" << i << "]";
  }
}

TEST(CpuStream, RunsWorkInOrderAndRethrows) {
  CpuStream stream;
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) stream.submit([&order, i] { order.push_back(i); });
  stream.wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  stream.submit([] { throw Error("deliberate"); });
  EXPECT_EQ(test::error_of([&] { stream.wait(); }), "deliberate");  // the work's own error, as it was
  stream.submit([&order] { order.push_back(5); });
  EXPECT_NO_THROW(stream.wait());  // usable after an error
  EXPECT_EQ(order.size(), 6u);
}

// Nobody leaves a Rendezvous before everyone has arrived: each party writes its slot before it
// arrives and reads all slots after. One party comes late, past the spinning (200 us), so the
// others sleep and must be woken; and without spinning, everyone who waits sleeps.
TEST(Rendezvous, NoPartyLeavesBeforeAllHaveArrived) {
  for (int parties : {1, 2, 4})
    for (auto late : {std::chrono::microseconds(0), std::chrono::microseconds(5000)})
      for (bool spin : {true, false}) {
        Rendezvous meet(parties, spin);
        std::vector<std::atomic<int>> arrived(parties);
        std::vector<int> saw(parties, -1);
        std::vector<std::thread> threads;
        for (int p = 0; p < parties; ++p)
          threads.emplace_back([&, p] {
            if (p == parties - 1) std::this_thread::sleep_for(late);
            arrived[p].store(1);
            meet.arrive_and_wait();
            int count = 0;
            for (const auto& slot : arrived) count += slot.load();
            saw[p] = count;
          });
        for (std::thread& thread : threads) thread.join();
        for (int p = 0; p < parties; ++p)
          EXPECT_EQ(saw[p], parties) << "party " << p << " of " << parties << (spin ? ", spinning" : "");
      }
}

// A party whose work never started is arrived for (arrive(), no wait): it counts, and the others
// get through once every party is in, not before.
TEST(Rendezvous, ArrivingForAMissingPartyLetsTheOthersThrough) {
  Rendezvous meet(3, true);
  std::atomic<bool> through{false};
  std::thread waiter([&] {
    meet.arrive_and_wait();
    through = true;
  });
  meet.arrive();  // for the party that never came: 2 of 3
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(through.load()) << "a waiter left with 2 of 3 parties in";
  meet.arrive_and_wait();
  waiter.join();
  EXPECT_TRUE(through.load());
}

// The tuner with windows of 3 rounds and no time floors (the tests decide by rounds, not by the
// host's speed), one window per configuration (close calls are LearnerTuner's tests), from one learner.
LearnerOptions quick_tuning(int max_learners) {
  LearnerOptions options{1, 1, SmaOptions{}};
  options.tune = true;
  options.tune_confirm_band = 0.0;
  options.tune_confirm_gains = false;
  options.tune_window = 3;
  options.tune_window_seconds = 0.0;
  options.tune_warmup_seconds = 0.0;
  options.max_learners = max_learners;
  return options;
}

// fit() with the tuner: it measures one learner first, then adds learners while the gain is
// large enough, and keeps one of the configurations it measured; training continues throughout.
TEST(Learners, TunerMeasuresAndKeepsAMeasuredConfiguration) {
  Dataset train = small_dataset(8 * 64, 3);
  LearnerOptions options = quick_tuning(3);
  options.tune_cores = 3;  // a learner a core at least: three learners need three (the host may have fewer)
  LearnerGroup group(models::mlp(), recipe(), options);
  TrainReport report = group.fit(train, nullptr, 3);
  const std::vector<TunerStep>& history = group.tuner_history();
  ASSERT_GE(history.size(), 2u);
  EXPECT_EQ(history.front().learners, 1);
  EXPECT_EQ(history.front().threads_per_learner, 3);
  const TunerStep& chosen = history.back();
  bool measured = false;
  for (size_t i = 0; i + 1 < history.size(); ++i) {
    EXPECT_EQ(history[i].learners, static_cast<int>(i) + 1);  // one more each time (a leap from 2 is capped at 3)
    EXPECT_GT(history[i].samples_per_second, 0.0);
    measured = measured || (history[i].learners == chosen.learners &&
                            history[i].samples_per_second == chosen.samples_per_second);
  }
  EXPECT_TRUE(measured);
  // A window cut short (options.tune_cut_short, the default) read clearly below the best before it.
  double best = 0.0;
  for (size_t i = 0; i + 1 < history.size(); ++i) {
    if (history[i].cut_short) {
      EXPECT_LT(history[i].samples_per_second, 0.9 * best) << i;
    }
    best = std::max(best, history[i].samples_per_second);
  }
  EXPECT_EQ(group.learners(), chosen.learners);
  EXPECT_GT(report.steps, 0);
  // A settled tuner's choice holds for the next fit(): nothing is measured again (a fit() an
  // epoch went through every configuration each time).
  ASSERT_TRUE(group.tuned());
  const std::vector<TunerStep> settled = history;
  const int threads = group.threads_per_learner();
  group.fit(train, nullptr, 1);
  EXPECT_TRUE(group.tuned());
  ASSERT_EQ(group.tuner_history().size(), settled.size());
  for (size_t i = 0; i < settled.size(); ++i)  // the same measurements, not new ones
    EXPECT_EQ(group.tuner_history()[i].samples_per_second, settled[i].samples_per_second) << i;
  EXPECT_EQ(group.learners(), settled.back().learners);
  EXPECT_EQ(group.threads_per_learner(), threads);

  // The caller's resize() overrules the tuner: tuned() no longer claims the group, the history
  // stays what the tuner measured, and the next fit() tunes again from one learner.
  group.resize(2, 1);
  EXPECT_FALSE(group.tuned());
  EXPECT_EQ(group.tuner_history().size(), settled.size());
  group.fit(train, nullptr, 1);
  ASSERT_FALSE(group.tuner_history().empty());
  EXPECT_EQ(group.tuner_history().front().learners, 1);
  EXPECT_EQ(group.tuner_history().front().threads_per_learner, 3);
  EXPECT_NE(group.tuner_history().front().samples_per_second, settled.front().samples_per_second)  // measured anew
      << "the next fit() kept the overruled choice";

  // From a callback during a fit() that tunes: the tuner stops there and the configuration given
  // holds for the rest of the fit().
  LearnerGroup overruled(models::mlp(), recipe(), options);
  overruled.on_epoch([&](const EpochReport& epoch) {
    if (epoch.epoch == 1) overruled.resize(2, 1);
    return true;
  });
  overruled.fit(train, nullptr, 3);
  EXPECT_FALSE(overruled.tuned());
  EXPECT_EQ(overruled.learners(), 2);
  EXPECT_EQ(overruled.threads_per_learner(), 1);
}

// Learners beside other learners time their ops while the others' run: they read the profile
// cache but do not write it, so a single model's later run does not start from contended
// timings. One learner alone (single-stream's computation) writes it as a Trainer does.
TEST(Learners, OnlyALoneLearnerWritesTheProfileCache) {
  Batches data(2 * 8, 41);
  for (const int learners : {2, 1}) {
    SCOPED_TRACE(cat(learners, " learner(s)"));
    const std::string cache = ::testing::TempDir() + cat("/learners_cache_", learners, ".json");
    std::remove(cache.c_str());
    TrainOptions train = recipe();
    train.policy = "auto";
    train.profile_cache = cache;
    {
      LearnerGroup group(models::mlp(), train, LearnerOptions{learners, 1, SmaOptions{}});
      for (int round = 0; round < 12; ++round) group.round(data.images.data(), data.labels.data());
      ASSERT_EQ(group.executor_tuning_runs_left(), 0) << "the learners' executors have not profiled yet";
    }
    EXPECT_EQ(std::filesystem::exists(cache), learners == 1);
    std::remove(cache.c_str());
  }
}

// Under a sync period the tuner ends its windows on sync rounds only, so the resize after one
// starts the replicas from a z that holds every step trained. An epoch of two batches ends right
// after a resize from one learner to two (and a round of two is a whole epoch), so the epoch's
// callback sees the round the group was resized after.
TEST(Learners, UnderASyncPeriodTheTunerResizesAfterSyncRoundsOnly) {
  LearnerOptions options = quick_tuning(2);
  options.tune_cores = 2;
  options.tune_bound = false;  // 2 x 1 is run, not bounded
  options.sync_period = 7;
  LearnerGroup group(models::mlp(), recipe(), options);
  int learners = group.learners(), resizes = 0;
  group.on_epoch([&](const EpochReport&) {
    if (group.learners() != learners) {
      ++resizes;
      EXPECT_EQ(group.rounds_done() % 7, 0) << "resized to " << group.learners() << " after round " << group.rounds_done();
      learners = group.learners();
    }
    return true;
  });
  group.fit(small_dataset(2 * 8, 3), nullptr, 200);
  EXPECT_GE(resizes, 1);
}

// One-thread learners are not run when the serial step the lone learner's executor measured bounds
// them at no gain (LearnerOptions::tune_bound): under a threshold no configuration can clear, 2 x 1
// is recorded as bounded, at no more than the bar, and the group stays one learner of two threads.
// With tune_bound off the same run measures 2 x 1. Training stops once the tuner has settled.
TEST(Learners, TunerDoesNotRunOneThreadLearnersBoundedBelowTheBar) {
  if (available_cores() < 2) GTEST_SKIP() << "one-thread learners need 2 cores to bound from a 2-thread executor";
  Dataset train = small_dataset(8 * 64, 3), test = small_dataset(64, 5);
  TrainOptions auto_policy = recipe();
  auto_policy.policy = "auto";  // its trial times the serial schedule the bound comes from
  auto_policy.threads = 2;
  auto_policy.eval_every = 16;
  for (bool bound : {true, false}) {
    SCOPED_TRACE(bound ? "tune_bound on" : "tune_bound off");
    LearnerOptions options = quick_tuning(2);
    options.tune_bound = bound;
    options.tune_threshold = 1e6;
    options.tune_cores = 2;
    LearnerGroup group(models::mlp(), auto_policy, options);
    group.on_evaluation([&group](const Evaluation&) { return !group.tuned(); });
    group.fit(train, &test, 1000);
    ASSERT_TRUE(group.tuned());
    const std::vector<TunerStep>& history = group.tuner_history();
    ASSERT_EQ(history.size(), 3u);  // 1 x 2, 2 x 1, the kept 1 x 2
    EXPECT_EQ(history[0].threads_per_learner, 2);
    EXPECT_FALSE(history[0].bounded);
    EXPECT_EQ(history[1].learners, 2);
    EXPECT_EQ(history[1].threads_per_learner, 1);
    EXPECT_EQ(history[1].bounded, bound);
    EXPECT_GT(history[1].samples_per_second, 0.0);
    if (bound) {  // 2 learners x batch 8 / the median serial step of the lone learner's trial
      const Executor* executor = group.learner_executor(0);
      ASSERT_NE(executor, nullptr);
      EXPECT_NEAR(history[1].samples_per_second * executor->trial_step_seconds("serial"), 2.0 * 8, 1e-9);
      EXPECT_DOUBLE_EQ(group.one_thread_bound(2), history[1].samples_per_second);
      EXPECT_DOUBLE_EQ(group.one_thread_bound(4), 2 * history[1].samples_per_second);
    }
    EXPECT_LE(history[1].samples_per_second, (1.0 + options.tune_threshold) * history[0].samples_per_second);
    EXPECT_EQ(history[2].learners, 1);
    EXPECT_EQ(group.learners(), 1);
    EXPECT_EQ(group.threads_per_learner(), 2);
  }
}

// fit() with every gain a close call (a band wider than any gain): the candidate is measured twice
// without a resize in between, then the best so far again, and the group ends as the tuner chose.
TEST(Learners, TunerMeasuresACloseCallTwiceWhileTraining) {
  Dataset train = small_dataset(8 * 64, 3);
  LearnerOptions options = quick_tuning(2);
  options.tune_cores = 2;
  options.tune_confirm_band = 1e9;
  LearnerGroup group(models::mlp(), recipe(), options);
  group.fit(train, nullptr, 4);
  ASSERT_TRUE(group.tuned());
  const std::vector<TunerStep>& history = group.tuner_history();
  ASSERT_EQ(history.size(), 5u);  // 1, 2, 2 again, 1 again, the choice
  const int expected[] = {1, 2, 2, 1};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(history[i].learners, expected[i]) << i;
    EXPECT_EQ(history[i].again, i >= 2) << i;
  }
  const TunerStep& chosen = history.back();
  // Each configuration counts its faster window (learner_tuner.h).
  const double one = std::max(history[0].samples_per_second, history[3].samples_per_second);
  const double two = std::max(history[1].samples_per_second, history[2].samples_per_second);
  EXPECT_EQ(chosen.learners, two > one * 1.1 ? 2 : 1);
  EXPECT_DOUBLE_EQ(chosen.samples_per_second, chosen.learners == 2 ? two : one);
  EXPECT_EQ(group.learners(), chosen.learners);
}

// The learners' auto executors profile over their first steps; executor_tuning_runs_left() counts
// those steps down to 0 (the bench and the tuner time nothing before), also under a staleness bound.
TEST(Learners, ExecutorTuningRunsCountDownToZero) {
  Batches data(2 * 8);
  TrainOptions train = recipe();
  train.policy = "auto";
  train.profile_cache = "";
  for (int staleness : {0, 1}) {
    LearnerGroup group(models::mlp(), train, stale(2, staleness));
    const int64_t at_start = group.executor_tuning_runs_left();
    EXPECT_GT(at_start, 0) << "staleness " << staleness;
    // The trial lasts at least trial_seconds (0.25 s) as well as a number of steps.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    int64_t rounds = 0;
    while (group.executor_tuning_runs_left() > 0 && std::chrono::steady_clock::now() < deadline) {
      group.round(data.images.data(), data.labels.data());
      ++rounds;
    }
    EXPECT_EQ(group.executor_tuning_runs_left(), 0) << "staleness " << staleness;
    EXPECT_GE(rounds, at_start) << "staleness " << staleness;
  }
  LearnerGroup serial(models::mlp(), recipe(), stale(2, 0));
  EXPECT_EQ(serial.executor_tuning_runs_left(), 0);  // nothing to profile under the serial policy
}

// The replicas of a configuration the group ran before adopt what its executor had learned
// (Executor::adopt): returning to one learner of two threads after two of one runs no profiling
// and no trial again, keeps the schedule and the trial's serial step (the tuner's one-thread
// bound reads it), and so does the way back to two learners (their profiles); one learner of one
// thread, a configuration not run yet, profiles afresh.
TEST(Learners, AConfigurationRunBeforeAdoptsItsExecutorsTuning) {
  Batches data(2 * 8);
  TrainOptions train = recipe();
  train.policy = "auto";
  train.profile_cache = "";
  LearnerGroup group(models::mlp(), train, LearnerOptions{1, 2, SmaOptions{}});
  auto train_until_tuned = [&] {  // true once the executors have profiled and chosen
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (group.executor_tuning_runs_left() > 0 && std::chrono::steady_clock::now() < deadline)
      group.round(data.images.data(), data.labels.data());
    return group.executor_tuning_runs_left() == 0;
  };
  ASSERT_TRUE(train_until_tuned());
  const Executor* lone = group.learner_executor(0);
  EXPECT_FALSE(lone->adopted());
  const std::string schedule = lone->chosen_schedule();
  const double serial_step = lone->trial_step_seconds("serial");
  ASSERT_GT(serial_step, 0.0);
  const double bound = group.one_thread_bound(2);

  group.resize(2, 1);
  EXPECT_GT(group.executor_tuning_runs_left(), 0) << "one thread: never profiled yet";
  EXPECT_FALSE(group.learner_executor(0)->adopted());
  ASSERT_TRUE(train_until_tuned());

  group.resize(1, 2);
  EXPECT_EQ(group.executor_tuning_runs_left(), 0);
  const Executor* back = group.learner_executor(0);
  EXPECT_TRUE(back->adopted());
  EXPECT_TRUE(back->tuned());
  EXPECT_EQ(back->chosen_schedule(), schedule);
  EXPECT_EQ(back->trial_step_seconds("serial"), serial_step);
  EXPECT_EQ(group.one_thread_bound(2), bound);
  const float loss = group.round(data.images.data(), data.labels.data());
  EXPECT_TRUE(std::isfinite(loss));

  group.resize(2, 1);
  EXPECT_EQ(group.executor_tuning_runs_left(), 0);
  for (int j = 0; j < 2; ++j) {
    EXPECT_TRUE(group.learner_executor(j)->adopted()) << "learner " << j;
  }
  // Another configuration at a known thread count tried its schedules under other contention:
  // nothing to adopt.
  group.resize(1, 1);
  EXPECT_FALSE(group.learner_executor(0)->adopted());
  EXPECT_GT(group.executor_tuning_runs_left(), 0);
}

// Twice as many replicas as the available memory holds: refused while the first is built, with
// the count, the model, the batch and the memory named.
TEST(Learners, TooManyLearnersForMemoryAreRefusedBeforeTraining) {
  if (available_memory_bytes() <= 0) GTEST_SKIP() << "available memory unknown here (no /proc/meminfo)";
  TrainOptions train = recipe();
  train.batch = 512;
  const int64_t per_learner = learner_bytes(Trainer(models::mlp(), train), false);
  const int64_t too_many = 2 * available_memory_bytes() / per_learner + 2;
  ASSERT_LT(too_many, int64_t{1} << 30);
  try {
    LearnerGroup group(models::mlp(), train, LearnerOptions{static_cast<int>(too_many), 1, SmaOptions{}});
    FAIL() << too_many << " replicas of " << per_learner << " bytes cannot fit";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(cat("learners: ", too_many, " replicas of 'mlp' at batch 512 need about ")), std::string::npos)
        << message;
    EXPECT_NE(message.find("MiB are available"), std::string::npos) << message;
  }
}

// The batches fit()'s feeder assembles ahead count in the memory check: four rounds of the largest
// group it may grow to (max_learners), up to 64 MiB. At batch 256 (0.8 MB a batch), a group that
// may grow to 16 learners queues 64 batches and is refused within a limit that holds two replicas,
// their round and a two-learner group's queue of 8, naming the queue.
TEST(Learners, TheBatchesTheFeederAssemblesAheadCountInTheMemoryCheck) {
  TrainOptions train = recipe();
  train.batch = 256;
  train.eval_batch = 1;  // as a replica's (LearnerGroup builds them so), and z's here too
  const int64_t each = learner_bytes(Trainer(models::mlp(), train), false);
  train.memory_limit = 2 * each + (int64_t{20} << 20);
  LearnerOptions options{2, 1, SmaOptions{}};
  options.max_learners = 2;  // the default is the host's cores
  EXPECT_NO_THROW(LearnerGroup(models::mlp(), train, options));
  options.max_learners = 16;
  try {
    LearnerGroup group(models::mlp(), train, options);
    FAIL() << "65 batches of 256 images do not fit in " << train.memory_limit << " bytes beside two replicas";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("learners: 2 replicas of 'mlp' at batch 256 need about "), std::string::npos) << message;
    EXPECT_NE(message.find(" MiB the 65 batches the feeder assembles ahead"), std::string::npos) << message;
  }
}

// A memory limit (TrainOptions::memory_limit) holds a group's replicas together: three that need
// more than it are refused; two that fit are built.
TEST(Learners, AMemoryLimitHoldsTheReplicasTogether) {
  TrainOptions train = recipe();
  train.batch = 64;
  train.eval_batch = 1;  // as a replica's (LearnerGroup builds them so), and z's here too
  const int64_t each = learner_bytes(Trainer(models::lstm(), train), false);
  train.memory_limit = 5 * each / 2;
  EXPECT_NO_THROW(LearnerGroup(models::lstm(), train, LearnerOptions{2, 1, SmaOptions{}}));
  try {
    LearnerGroup group(models::lstm(), train, LearnerOptions{3, 1, SmaOptions{}});
    FAIL() << "3 replicas of " << each << " bytes cannot fit in " << train.memory_limit;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("learners: 3 replicas of 'lstm' at batch 64 need about "),
              std::string::npos) << error.what();
  }
}

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

// Learners of several threads each that together outnumber the cores (quiver-train warns) get
// their threads: while the group lives TBB may run every learner's thread and its workers at
// once (ThreadBudget.BudgetsSideBySideUseAllTheirThreadsUnderAnAllowance shows what that buys);
// resized to fit the cores, and once it is gone, the limit is back where it was.
TEST(Learners, LearnersAboveTheCoresMayRunAllTheirThreads) {
  const int t = std::max(2, available_cores());
  const int limit_before = thread_limit();
  Batches data(16);
  TrainOptions train = recipe();
  train.policy = "intra";
  train.threads = 2 * t;
  {
    LearnerGroup group(models::mlp(), train, LearnerOptions{2, t, SmaOptions{}});
    EXPECT_GE(thread_limit(), 2 * (t - 1) + 1);
    EXPECT_TRUE(std::isfinite(group.round(data.images.data(), data.labels.data())));
    group.resize(2, 1);
    EXPECT_EQ(thread_limit(), limit_before);
    group.resize(2, t);
    EXPECT_GE(thread_limit(), 2 * (t - 1) + 1);
  }
  EXPECT_EQ(thread_limit(), limit_before);
}

// A resize carries each replica's optimizer state and, with it, its step count: Adam's bias
// correction then goes on from step 4, as one model's would (it restarted at 1 on moments that
// were 3 steps old). One learner with the default alpha is plain training, so after the resize
// its parameters equal a plain Adam trainer's, bit for bit.
TEST(Learners, AResizeCarriesTheStepCountWithTheOptimizerState) {
  Batches data(8, 31);
  TrainOptions train = recipe();
  train.optimizer = "adam";
  train.learning_rate = 1e-3;
  LearnerGroup group(models::mlp(), train, LearnerOptions{1, 1, SmaOptions{}});
  Trainer plain(models::mlp(), train);
  for (int step = 0; step < 3; ++step) {
    group.round(data.images.data(), data.labels.data());
    plain.train_step(data.images.data(), data.labels.data());
  }
  group.resize(1, 1);
  group.round(data.images.data(), data.labels.data());
  plain.train_step(data.images.data(), data.labels.data());
  const Tensor& a = group.replica(0).flat_params();
  const Tensor& b = plain.params().flat_params();
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.f32()[i], b.f32()[i]) << "parameter " << i;
}

// Which predecessor's optimizer state each new replica takes: replica j takes old learner
// j mod k's, bit for bit (2 -> 2 keeps each its own, 2 -> 3 gives the third learner 0's). The two
// learners trained on different batches, so their momenta differ and a wrong mapping shows.
TEST(Learners, AResizeGivesEachReplicaItsPredecessorsMomentum) {
  Batches data(2 * 8, 41);
  LearnerGroup group(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
  for (int round = 0; round < 3; ++round) group.round(data.images.data(), data.labels.data());
  std::vector<std::vector<float>> before;
  for (int j = 0; j < 2; ++j) {
    const Tensor& v = group.replica(j).flat_state("velocity");
    before.emplace_back(v.f32(), v.f32() + v.numel());
  }
  ASSERT_NE(before[0], before[1]) << "the learners' momenta must differ for this test to tell them apart";
  group.resize(2, 1);
  for (int j = 0; j < 2; ++j) {
    const Tensor& v = group.replica(j).flat_state("velocity");
    EXPECT_EQ(std::vector<float>(v.f32(), v.f32() + v.numel()), before[j]) << "replica " << j << " after 2 -> 2";
  }
  group.resize(3, 1);
  for (int j = 0; j < 3; ++j) {
    const Tensor& v = group.replica(j).flat_state("velocity");
    EXPECT_EQ(std::vector<float>(v.f32(), v.f32() + v.numel()), before[j % 2]) << "replica " << j << " after 2 -> 3";
  }
}

// z keeps its momentum through a resize too. Every replica restarts from z, so the first round
// after it corrects nothing (s_j = z): z's move that round is mu_z times its last, where a z
// that had restarted from rest would not move at all.
TEST(Learners, AResizeCarriesTheAverageModelsMomentum) {
  Batches data(2 * 8, 5);
  LearnerGroup group(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
  for (int round = 0; round < 2; ++round) group.round(data.images.data(), data.labels.data());
  const Tensor& z = group.average();
  const std::vector<float> before(z.f32(), z.f32() + z.numel());
  group.round(data.images.data(), data.labels.data());
  const std::vector<float> after(z.f32(), z.f32() + z.numel());
  group.resize(2, 1);
  group.round(data.images.data(), data.labels.data());
  const float mu_z = static_cast<float>(SmaOptions{}.mu_z);
  double largest_move = 0.0;
  for (int64_t i = 0; i < z.numel(); ++i) {
    const float last_move = after[i] - before[i];
    largest_move = std::max(largest_move, std::abs(static_cast<double>(last_move)));
    ASSERT_NEAR(z.f32()[i] - after[i], mu_z * last_move, 1e-6 + 1e-3 * std::abs(last_move)) << "parameter " << i;
  }
  EXPECT_GT(largest_move, 1e-4);  // z was moving before the resize
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
