// The learners' learning rate: the scaling rules for k learners (LrScaling), a learning-rate
// drop (every replica reset to z, DESIGN.md section 3), the step decay fit() follows, and the
// fold of a sync period's local steps into z before a reset or a resize and at an epoch's end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/models.h"
#include "runtime/learners.h"
#include "runtime/sma.h"
#include "tests/runtime/learner_test_data.h"

namespace quiver {
namespace {

using namespace learner_test;  // Batches, PlainPair, rounds_in_lockstep, small_dataset and the rest

// Under SMA with alpha 0 (no corrections) learner 0 of k is plain momentum SGD on its batches at
// the rate `rule` gives k learners: `factor` x lr, bit for bit, and not at lr itself.
void expect_learner0_trains_at(LrScaling rule, int learners, double factor) {
  Batches data(learners * 8, 37);
  LearnerOptions sma{learners, 1, SmaOptions{0.0, 0.9}};
  sma.lr_scaling = rule;
  LearnerGroup group(models::mlp(), recipe(), sma);
  TrainOptions scaled = recipe();
  scaled.learning_rate *= factor;
  Trainer plain(models::mlp(), scaled), unscaled(models::mlp(), recipe());
  for (int step = 0; step < 5; ++step) {
    group.round(data.images.data(), data.labels.data());  // learner 0: the first 8 samples
    plain.train_step(data.images.data(), data.labels.data());
    unscaled.train_step(data.images.data(), data.labels.data());
  }
  const Tensor& w0 = group.replica(0).flat_params();
  bool differs_from_unscaled = false;
  for (int64_t i = 0; i < w0.numel(); ++i) {
    ASSERT_EQ(w0.f32()[i], plain.params().flat_params().f32()[i]) << "parameter " << i;
    differs_from_unscaled = differs_from_unscaled || w0.f32()[i] != unscaled.params().flat_params().f32()[i];
  }
  EXPECT_TRUE(differs_from_unscaled);
}

// The linear scaling rule (LrScaling::Linear): k learners train at k x the learning rate. Under
// SMA 2 learners train at 2 x lr; under synchronous SGD, 3 learners of batch 8 equal one learner
// of batch 24 at 3 x lr; and one learner is unchanged (single-stream training, lr as given).
TEST(Learners, LinearScalingTrainsKLearnersAtKTimesTheRate) {
  expect_learner0_trains_at(LrScaling::Linear, 2, 2.0);
  Batches data(3 * 8, 37);
  LearnerOptions ssgd{3, 1, SmaOptions{}};
  ssgd.sync = Sync::Ssgd;
  ssgd.lr_scaling = LrScaling::Linear;
  LearnerGroup three(models::mlp(), recipe(), ssgd);
  TrainOptions big = recipe();
  big.batch = 24;
  big.eval_batch = 24;
  big.learning_rate *= 3;
  Trainer single(models::mlp(), big);
  for (int step = 0; step < 5; ++step) {
    three.round(data.images.data(), data.labels.data());
    single.train_step(data.images.data(), data.labels.data());
  }
  const Tensor& z = three.average();
  const Tensor& w = single.params().flat_params();
  for (int64_t i = 0; i < z.numel(); ++i) ASSERT_NEAR(z.f32()[i], w.f32()[i], 1e-5 * std::abs(w.f32()[i]) + 1e-6) << i;

  LearnerOptions one{1, 1, SmaOptions{}};
  one.lr_scaling = LrScaling::Linear;
  LearnerGroup alone(models::mlp(), recipe(), one);
  Trainer reference(models::mlp(), recipe());
  for (int step = 0; step < 5; ++step) {
    alone.round(data.images.data(), data.labels.data());
    reference.train_step(data.images.data(), data.labels.data());
  }
  const Tensor& z1 = alone.average();
  for (int64_t i = 0; i < z1.numel(); ++i) ASSERT_EQ(z1.f32()[i], reference.params().flat_params().f32()[i]) << i;
}

// The square-root rule (LrScaling::Sqrt): 4 learners train at 2 x lr (exact in floats), 2 at
// sqrt(2) x lr, one at lr; the rule's name is parsed, and a wrong one refused with the choices.
TEST(Learners, SqrtScalingTrainsKLearnersAtRootKTimesTheRate) {
  expect_learner0_trains_at(LrScaling::Sqrt, 4, 2.0);
  EXPECT_DOUBLE_EQ(lr_scale(LrScaling::Sqrt, 2), std::sqrt(2.0));
  EXPECT_EQ(lr_scale(LrScaling::Sqrt, 1), 1.0);
  EXPECT_EQ(lr_scale(LrScaling::None, 8), 1.0);
  EXPECT_EQ(lr_scale(LrScaling::Linear, 8), 8.0);
  EXPECT_EQ(parse_lr_scaling("sqrt"), LrScaling::Sqrt);
  EXPECT_EQ(parse_lr_scaling("linear"), LrScaling::Linear);
  EXPECT_EQ(parse_lr_scaling("none"), LrScaling::None);
  try {
    parse_lr_scaling("cubic");
    FAIL() << "an unknown rule was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("none, linear or sqrt"), std::string::npos) << error.what();
  }
}

// A learning-rate drop (DESIGN.md section 3): every replica becomes z, z's momentum is cleared,
// and the learners go on at the new rate. The reference: the plain trainers set to z at the new
// rate and the textbook round reset the same way, for two more rounds.
TEST(Learners, ALearningRateDropResetsEveryReplicaToZ) {
  Batches data(2 * 8, 31);
  LearnerGroup group(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{0.5, 0.9}});
  PlainPair plain(models::mlp());
  Tensor z = copy_of(group.average());
  SmaSync textbook(z, 2, SmaOptions{0.5, 0.9});
  rounds_in_lockstep(group, plain, textbook, data, 3);
  group.set_learning_rate_factor(0.5);
  EXPECT_DOUBLE_EQ(group.learning_rate(), 0.005);
  EXPECT_DOUBLE_EQ(group.learning_rate_factor(), 0.5);
  const Tensor& average = group.average();
  for (int j = 0; j < 2; ++j)
    for (int64_t i = 0; i < average.numel(); ++i)
      ASSERT_EQ(group.replica(j).flat_params().f32()[i], average.f32()[i]) << "w" << j << "[" << i << "]";
  std::vector<Tensor> replicas = {plain.w(0), plain.w(1)};
  textbook.reset_replicas(replicas);
  for (auto& trainer : plain.trainers) trainer->set_learning_rate(0.005);
  rounds_in_lockstep(group, plain, textbook, data, 2);
  for (int64_t i = 0; i < z.numel(); ++i) {
    ASSERT_NEAR(group.average().f32()[i], z.f32()[i], 1e-6) << "z[" << i << "]";
    for (int j = 0; j < 2; ++j)
      ASSERT_NEAR(group.replica(j).flat_params().f32()[i], plain.w(j).f32()[i], 1e-6) << "w" << j << "[" << i << "]";
  }
  // The same factor again is no drop: nothing is reset.
  const Tensor before = copy_of(group.replica(0).flat_params());
  group.set_learning_rate_factor(0.5);
  for (int64_t i = 0; i < before.numel(); ++i) ASSERT_EQ(group.replica(0).flat_params().f32()[i], before.f32()[i]);
  EXPECT_THROW(group.set_learning_rate_factor(0.0), Error);
  EXPECT_THROW(group.set_learning_rate_factor(std::nan("")), Error);
}

// Under a sync period z holds the steps up to the last sync round only: a drop (reset_replicas)
// or a resize in the middle of a period first folds the local steps since then into z, one SMA
// pass with each replica's parameters as its snapshot, so none is lost. Period 3, four rounds:
// the fourth is a local step, and z must take it.
TEST(Learners, UnderASyncPeriodADropOrAResizeFoldsTheLocalStepsIntoZ) {
  for (const bool resize : {false, true}) {
    SCOPED_TRACE(resize ? "resize" : "reset_replicas");
    Batches data(2 * 8, 37);
    LearnerGroup group(models::mlp(), recipe(), two_syncing_every(3));
    PlainPair plain(models::mlp());
    Tensor z = copy_of(group.average());
    SmaSync textbook(z, 2, SmaOptions{0.5, 0.9});
    for (int round = 1; round <= 4; ++round) {
      group.round(data.images.data(), data.labels.data());
      plain.step(data);
      if (round % 3 == 0) textbook.round(plain.params, plain.snapshots);
    }
    const Tensor at_last_sync = copy_of(z);
    if (resize)
      group.resize(2, 1);
    else
      group.reset_replicas();
    const std::vector<Tensor> now = {copy_of(plain.w(0)), copy_of(plain.w(1))};
    textbook.round(plain.params, now);
    double folded = 0.0;
    for (int64_t i = 0; i < z.numel(); ++i) {
      ASSERT_NEAR(group.average().f32()[i], z.f32()[i], 1e-6) << "z[" << i << "]";
      for (int j = 0; j < 2; ++j)
        ASSERT_EQ(group.replica(j).flat_params().f32()[i], group.average().f32()[i]) << "w" << j << "[" << i << "]";
      folded += std::abs(z.f32()[i] - at_last_sync.f32()[i]);
    }
    EXPECT_GT(folded, 0.0) << "the fourth round's steps were not folded in";
  }
}

// fit() ends every epoch with z holding every step: under period 2 an epoch of three rounds ends
// on a local step, which z takes before the epoch's callback (where a checkpoint is saved) sees
// it; the second epoch (rounds 4-6) keeps the period's phase and ends on a sync round. Every
// sample is the same, so fit()'s shuffled batches are the batches the textbook's trainers take.
TEST(Learners, UnderASyncPeriodAnEpochEndsWithItsLocalStepsFoldedIntoZ) {
  Batches data(6 * 8, 37);
  for (int64_t i = 1; i < 6 * 8; ++i) {
    std::copy_n(data.images.begin(), 784, data.images.begin() + i * 784);
    data.labels[i] = data.labels[0];
  }
  LearnerGroup group(models::mlp(), recipe(), two_syncing_every(2));
  PlainPair plain(models::mlp());
  Tensor z = copy_of(group.average());
  SmaSync textbook(z, 2, SmaOptions{0.5, 0.9});
  std::vector<Tensor> seen;  // z as each epoch's callback sees it
  group.on_epoch([&](const EpochReport&) {
    seen.push_back(copy_of(group.average()));
    return true;
  });
  group.fit(dataset_of(data), nullptr, 2);
  ASSERT_EQ(seen.size(), 2u);
  for (int round = 1; round <= 6; ++round) {
    plain.step(data);
    if (round % 2 == 0) textbook.round(plain.params, plain.snapshots);
    if (round % 3 != 0) continue;
    SCOPED_TRACE("epoch " + std::to_string(round / 3));
    const Tensor before_fold = copy_of(z);
    if (round == 3) {
      const std::vector<Tensor> now = {copy_of(plain.w(0)), copy_of(plain.w(1))};
      textbook.round(plain.params, now);
    }
    double folded = 0.0;
    for (int64_t i = 0; i < z.numel(); ++i) {
      ASSERT_NEAR(seen[round / 3 - 1].f32()[i], z.f32()[i], 1e-6) << "z[" << i << "]";
      folded += std::abs(z.f32()[i] - before_fold.f32()[i]);
    }
    if (round == 3) {
      EXPECT_GT(folded, 0.0) << "round 3's steps were not folded in";
    }
  }
}

// The epoch's accuracy is of the folded z, also where an evaluation whose callback stops the fit
// ran just before the fold, at the same batch: the epoch evaluates again after it. Period 2,
// eval_every 3 batches, an epoch of 10 batches stopped at batch 6, after round 3 (a local step).
TEST(Learners, UnderASyncPeriodAnEpochsAccuracyIsOfTheFoldedZ) {
  const Dataset train = small_dataset(80, 5), test = small_dataset(16, 6);
  TrainOptions options = recipe();
  options.eval_every = 3;
  LearnerGroup group(models::mlp(), options, two_syncing_every(2));
  std::vector<int64_t> batches;
  Tensor evaluated;  // z as the last evaluation saw it
  group.on_evaluation([&](const Evaluation& e) {
    batches.push_back(e.batches);
    evaluated = copy_of(group.average());
    return e.batches < 6;
  });
  const TrainReport report = group.fit(train, &test, 1);
  EXPECT_EQ(batches, (std::vector<int64_t>{4, 6, 6}));  // the second at batch 6 after the fold
  ASSERT_EQ(report.epochs.size(), 1u);
  EXPECT_EQ(report.epochs[0].test_accuracy, group.evaluate(test));
  for (int64_t i = 0; i < evaluated.numel(); ++i) ASSERT_EQ(evaluated.f32()[i], group.average().f32()[i]) << i;
}

// fit() follows the step decay: a drop at epoch 2 trains as a factor set by hand between two
// fits, bit for bit; each epoch reports its rate; a run resumed from a checkpoint after epoch 1
// trains epoch 2 at the dropped rate.
TEST(Learners, FitFollowsTheStepDecay) {
  const Dataset train = small_dataset(48, 11);  // 6 batches of 8: 3 rounds of 2 learners an epoch
  TrainOptions decayed = recipe();
  decayed.lr_drop_epochs = {2};
  decayed.lr_drop_factor = 0.5;
  const LearnerOptions two{2, 1, SmaOptions{}};
  LearnerGroup scheduled(models::mlp(), decayed, two);
  const TrainReport report = scheduled.fit(train, nullptr, 2);
  ASSERT_EQ(report.epochs.size(), 2u);
  EXPECT_DOUBLE_EQ(report.epochs[0].learning_rate, 0.01);
  EXPECT_DOUBLE_EQ(report.epochs[1].learning_rate, 0.005);
  LearnerGroup by_hand(models::mlp(), recipe(), two);
  by_hand.fit(train, nullptr, 1);
  by_hand.set_learning_rate_factor(0.5);
  by_hand.fit(train, nullptr, 1);
  const Tensor &a = scheduled.average(), &b = by_hand.average();
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.f32()[i], b.f32()[i]) << "z[" << i << "]";
  LearnerGroup constant(models::mlp(), recipe(), two);
  constant.fit(train, nullptr, 2);
  double apart = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) apart += std::abs(a.f32()[i] - constant.average().f32()[i]);
  EXPECT_GT(apart, 0.0) << "the decay changed nothing";
  const std::string path = ::testing::TempDir() + "/step_decay.ckpt";
  LearnerGroup first(models::mlp(), decayed, two);
  first.fit(train, nullptr, 1);
  first.save(path);
  LearnerGroup resumed(models::mlp(), decayed, two);
  resumed.load(path);
  const TrainReport second = resumed.fit(train, nullptr, 1);
  EXPECT_EQ(second.epochs.at(0).epoch, 2);
  EXPECT_DOUBLE_EQ(second.epochs.at(0).learning_rate, 0.005);
  std::remove(path.c_str());
}

// The rate factor (a drop) holds through a resize, and the scaling rule follows the new count:
// linear scaling at factor 0.5 trains 2 learners at 2 x 0.5 x lr, then 3 at 3 x 0.5 x lr.
TEST(Learners, TheRateFactorOutlivesAResize) {
  LearnerOptions linear{2, 1, SmaOptions{}};
  linear.lr_scaling = LrScaling::Linear;
  LearnerGroup group(models::mlp(), recipe(), linear);
  EXPECT_DOUBLE_EQ(group.learning_rate(), 0.02);
  group.set_learning_rate_factor(0.5);
  EXPECT_DOUBLE_EQ(group.learning_rate(), 0.01);
  group.resize(3, 1);
  EXPECT_DOUBLE_EQ(group.learning_rate(), 0.015);
  EXPECT_DOUBLE_EQ(group.learning_rate_factor(), 0.5);
}

}  // namespace
}  // namespace quiver
