// Checkpoints of the average model: an exact round trip, resume continuing the loss curve and
// the data order, a load restarting every momentum, and corrupt, truncated and foreign files
// refused clearly.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "core/nn.h"
#include "models/models.h"
#include "runtime/checkpoint.h"
#include "runtime/learners.h"
#include "tests/runtime/learner_test_data.h"

namespace quiver {
namespace {

using learner_test::Batches;
using learner_test::recipe;
using learner_test::small_dataset;

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

// One learner's average model is its replica, whose failed step has run in full: after a NaN
// round, save() refuses the diverged model and the last good checkpoint stays loadable (it was
// once replaced by one that load refuses).
TEST(Checkpoint, ADivergedModelIsNotSavedOverAGoodOne) {
  Batches data(8, 22);
  const std::string path = checkpoint_path("diverged");
  LearnerGroup group(models::mlp(), recipe(), LearnerOptions{1, 1, SmaOptions{}});
  group.round(data.images.data(), data.labels.data());
  group.save(path);
  const std::vector<float> good(group.average().f32(), group.average().f32() + group.average().numel());
  group.round(data.images.data(), data.labels.data());
  std::vector<float> poisoned = data.images;
  for (float& value : poisoned) value = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(group.round(poisoned.data(), data.labels.data()), Error);
  try {
    group.save(path);
    FAIL() << "a diverged model was saved";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("not saved"), std::string::npos) << error.what();
  }
  LearnerGroup fresh(models::mlp(), recipe(), LearnerOptions{1, 1, SmaOptions{}});
  fresh.load(path);
  for (size_t i = 0; i < good.size(); ++i) ASSERT_EQ(fresh.average().f32()[i], good[i]) << "parameter " << i;
  std::filesystem::remove(path);
}

// A checkpoint made read-only (to keep it) is not replaced by a save through the API, also by
// root: the rename would be allowed, so the library refuses it itself (quiver-train refused it up
// front; a library caller had no such check). The file keeps its model.
TEST(Checkpoint, AReadOnlyCheckpointIsNotReplaced) {
  Batches data(8, 23);
  const std::string path = checkpoint_path("read_only");
  LearnerGroup group(models::mlp(), recipe(), LearnerOptions{1, 1, SmaOptions{}});
  group.round(data.images.data(), data.labels.data());
  group.save(path);
  const std::vector<float> kept(group.average().f32(), group.average().f32() + group.average().numel());
  ASSERT_EQ(::chmod(path.c_str(), 0444), 0);
  group.round(data.images.data(), data.labels.data());
  try {
    group.save(path);
    FAIL() << "a read-only checkpoint was replaced";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), cat("checkpoint: cannot replace '", path, "': it is read-only"));
  }
  LearnerGroup fresh(models::mlp(), recipe(), LearnerOptions{1, 1, SmaOptions{}});
  fresh.load(path);
  for (size_t i = 0; i < kept.size(); ++i) ASSERT_EQ(fresh.average().f32()[i], kept[i]) << "parameter " << i;
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  EXPECT_NO_THROW(group.save(path));  // writable again: saved
  std::filesystem::remove(path);
}

// A model named with bytes that are not UTF-8 text cannot go into the header's JSON: a
// quiver::Error that says so, the good file left as it was (the JSON library's own exception got
// out of save(), and out of fit() when it saved from a callback).
TEST(Checkpoint, ANameThatIsNotUtf8IsRefusedClearly) {
  const std::string path = checkpoint_path("utf8");
  LearnerGroup good(models::mlp(), recipe(), LearnerOptions{1, 1, SmaOptions{}});
  good.save(path);
  ModelSpec latin1 = models::mlp();
  latin1.name = "mod\xe8le";  // "modele" in Latin-1
  LearnerGroup group(latin1, recipe(), LearnerOptions{1, 1, SmaOptions{}});
  try {
    group.save(path);
    FAIL() << "a header that is not UTF-8 was written";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("not saved: the model's or a parameter's name is not UTF-8 text"),
              std::string::npos)
        << error.what();
  }
  EXPECT_NO_THROW(good.load(path));
  std::filesystem::remove(path);
}

// A checkpoint carries the epochs finished: a group resumed from it continues the data order
// where the saving group would, not from the first epoch's order.
TEST(Checkpoint, ResumeContinuesTheDataOrder) {
  const Dataset train = small_dataset(48, 9);  // 3 rounds of 2 x 8 an epoch
  const std::string path = checkpoint_path("epochs");
  LearnerGroup saver(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
  saver.fit(train, nullptr, 1);
  saver.save(path);
  LearnerGroup resumed(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
  resumed.load(path);
  EXPECT_EQ(resumed.epochs_done(), 1);
  EXPECT_EQ(resumed.rounds_done(), 3);
  saver.load(path);  // the same fresh start (momentum cleared) for the saving group
  saver.fit(train, nullptr, 1);
  resumed.fit(train, nullptr, 1);
  const Tensor &a = saver.average(), &b = resumed.average();
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.f32()[i], b.f32()[i]) << "parameter " << i;
  // And the order matters: the same z under a header of no finished epochs trains its next epoch
  // in the first epoch's order, to another model.
  const std::string first_epoch_path = checkpoint_path("epochs0");
  LearnerGroup replayed(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
  replayed.load(path);
  save_checkpoint(first_epoch_path, replayed.replica(0), replayed.average(), CheckpointInfo{"mlp", 3, 0});
  replayed.load(first_epoch_path);
  EXPECT_EQ(replayed.epochs_done(), 0);
  replayed.fit(train, nullptr, 1);
  const Tensor& c = replayed.average();
  EXPECT_NE(std::vector<float>(c.f32(), c.f32() + c.numel()), std::vector<float>(b.f32(), b.f32() + b.numel()));
  std::filesystem::remove(path);
  std::filesystem::remove(first_epoch_path);
}

// A checkpoint saved by the evaluation at an epoch's end (keeping the best model, say) holds that
// epoch finished: resumed, training goes on with the next epoch. (The epoch was counted after its
// evaluation: the file held it unfinished, and a resumed run trained its last batch again and
// reported the epoch twice.)
TEST(Checkpoint, ASaveByTheEpochsEvaluationHoldsTheEpochFinished) {
  const Dataset train = small_dataset(48, 9), test = small_dataset(16, 3);
  const std::string path = checkpoint_path("at_evaluation");
  const LearnerOptions one{1, 1, SmaOptions{}};
  LearnerGroup saver(models::mlp(), recipe(), one);
  int64_t seen_done = -1;
  saver.on_evaluation([&](const Evaluation&) {
    seen_done = saver.epochs_done();
    saver.save(path);
    return true;
  });
  saver.fit(train, &test, 1);
  EXPECT_EQ(seen_done, 1);
  LearnerGroup resumed(models::mlp(), recipe(), one);
  resumed.load(path);
  EXPECT_EQ(resumed.epochs_done(), 1);
  EXPECT_EQ(resumed.epoch_samples_done(), 0);
  const TrainReport next = resumed.fit(train, nullptr, 1);
  ASSERT_EQ(next.epochs.size(), 1u);
  EXPECT_EQ(next.epochs[0].epoch, 2);
  EXPECT_EQ(next.epochs[0].steps, 6);
  // A single model's callback sees its epoch counted too.
  TrainOptions options = recipe();
  options.batch = 8;
  Trainer single(models::mlp(), options);
  single.on_evaluation([&](const Evaluation&) {
    seen_done = single.epochs_done();
    return true;
  });
  single.fit(train, &test);
  EXPECT_EQ(seen_done, 1);
  std::filesystem::remove(path);
}

// Between the syncs of a sync period z lacks the local rounds since the last sync: a checkpoint
// saved then (by an eval_every evaluation here) records the progress as of that sync, so the
// resumed run trains those rounds again. (It recorded every round handed out: the resumed run
// skipped the samples of the rounds z had not learned from.)
TEST(Checkpoint, ASaveBetweenSyncsHoldsTheProgressOfTheLastSync) {
  const Dataset train = small_dataset(160, 6);  // 20 batches of 8 an epoch: 10 rounds of 2
  const std::string path = checkpoint_path("between_syncs");
  TrainOptions every_six = recipe();
  every_six.eval_every = 6;  // batches: rounds 3, 6 and 9
  LearnerOptions period{2, 1, SmaOptions{}};
  period.sync_period = 4;  // syncs at rounds 4 and 8
  LearnerGroup saver(models::mlp(), every_six, period);
  std::vector<float> saved;
  int evaluations = 0;
  saver.on_evaluation([&](const Evaluation&) {
    if (++evaluations == 2) {  // round 6
      EXPECT_EQ(saver.rounds_done(), 6);
      saver.save(path);
      const Tensor& z = saver.average();
      saved.assign(z.f32(), z.f32() + z.numel());
    }
    return true;
  });
  saver.fit(train, &train, 1);
  ASSERT_GE(evaluations, 2);
  LearnerGroup resumed(models::mlp(), recipe(), period);
  resumed.load(path);
  EXPECT_EQ(resumed.rounds_done(), 4);
  EXPECT_EQ(resumed.epoch_samples_done(), 4 * 2 * 8);
  const Tensor& z = resumed.average();
  for (size_t i = 0; i < saved.size(); ++i) ASSERT_EQ(z.f32()[i], saved[i]) << "parameter " << i;
  const TrainReport rest = resumed.fit(train, nullptr, 1);
  ASSERT_EQ(rest.epochs.size(), 1u);
  EXPECT_EQ(rest.epochs[0].steps, 6);  // rounds 5 to 10 of the epoch
  // round() alone: the same rule, and at a sync the file holds every round.
  LearnerGroup direct(models::mlp(), recipe(), period);
  Batches data(2 * 8, 23);
  for (int round = 0; round < 6; ++round) direct.round(data.images.data(), data.labels.data());
  direct.save(path);
  LearnerGroup from_direct(models::mlp(), recipe(), period);
  from_direct.load(path);
  EXPECT_EQ(from_direct.rounds_done(), 4);
  for (int round = 6; round < 8; ++round) direct.round(data.images.data(), data.labels.data());
  direct.save(path);
  from_direct.load(path);
  EXPECT_EQ(from_direct.rounds_done(), 8);
  // fit() cut inside an epoch ends with a fold: rounds after it by round() alone take no samples
  // of the epoch, and a save before their sync holds the fit's position (it had subtracted
  // their samples from it).
  LearnerGroup cut(models::mlp(), recipe(), period);
  cut.fit(train, nullptr, 1, 4);
  ASSERT_EQ(cut.epoch_samples_done(), 4 * 2 * 8);
  for (int round = 0; round < 2; ++round) cut.round(data.images.data(), data.labels.data());  // 5, 6: local
  cut.save(path);
  LearnerGroup from_cut(models::mlp(), recipe(), period);
  from_cut.load(path);
  EXPECT_EQ(from_cut.rounds_done(), 4);
  EXPECT_EQ(from_cut.epoch_samples_done(), 4 * 2 * 8);
  // fit() after rounds of round() alone folds them in first: its epoch starts with z holding every
  // round, so a save before its first sync holds those rounds (and none of the epoch's samples).
  TrainOptions every_round = every_six;
  every_round.eval_every = 2;  // batches: after each round of 2
  LearnerGroup first_round(models::mlp(), every_round, period);
  for (int round = 0; round < 2; ++round) first_round.round(data.images.data(), data.labels.data());  // 1, 2: local
  bool saved_once = false;
  first_round.on_evaluation([&](const Evaluation&) {
    if (!saved_once) first_round.save(path), saved_once = true;  // after round 3: local
    return true;
  });
  first_round.fit(train, &train, 1);
  ASSERT_TRUE(saved_once);
  LearnerGroup from_first(models::mlp(), recipe(), period);
  from_first.load(path);
  EXPECT_EQ(from_first.rounds_done(), 2);
  EXPECT_EQ(from_first.epoch_samples_done(), 0);
  std::filesystem::remove(path);
}

// An epoch cut short (max_rounds) goes on where it stopped: with stateless SGD (momentum 0) and
// one learner (plain training, z is its model), training cut at round 7, saved and resumed is the
// uninterrupted training bit for bit. Epochs are numbered from the start of training, and the cut
// epoch counts as the first of the resumed fit()'s. (Before, the cut epoch started again.) Under
// another seed the cut epoch's order is not this run's: it starts again, with a warning.
TEST(Checkpoint, ACutEpochGoesOnWhereItStopped) {
  const Dataset train = small_dataset(80, 4);  // 10 batches of 8 an epoch
  TrainOptions stateless = recipe();
  stateless.momentum = 0.0;
  stateless.learning_rate = 0.05;
  const LearnerOptions one{1, 1, SmaOptions{}};
  LearnerGroup whole(models::mlp(), stateless, one);
  whole.fit(train, nullptr, 2);
  const std::string path = checkpoint_path("cut");
  LearnerGroup cut(models::mlp(), stateless, one);
  cut.fit(train, nullptr, 2, 7);
  EXPECT_EQ(cut.epochs_done(), 0);
  EXPECT_EQ(cut.epoch_samples_done(), 7 * 8);
  cut.save(path);
  LearnerGroup resumed(models::mlp(), stateless, one);
  resumed.load(path);
  EXPECT_EQ(resumed.epoch_samples_done(), 7 * 8);
  const TrainReport rest = resumed.fit(train, nullptr, 2);
  ASSERT_EQ(rest.epochs.size(), 2u);
  EXPECT_EQ(rest.epochs[0].epoch, 1);
  EXPECT_EQ(rest.epochs[0].steps, 3);  // the cut epoch's last 3 batches
  EXPECT_EQ(rest.epochs[1].epoch, 2);
  EXPECT_EQ(rest.epochs[1].steps, 10);
  EXPECT_EQ(resumed.epochs_done(), 2);
  EXPECT_EQ(resumed.epoch_samples_done(), 0);
  const Tensor &a = whole.average(), &b = resumed.average();
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.f32()[i], b.f32()[i]) << "parameter " << i;
  std::vector<std::string> warnings;
  const WarningSink previous = set_warning_sink([&](const std::string& w) { warnings.push_back(w); });
  TrainOptions other_seed = stateless;
  other_seed.seed = 2;
  LearnerGroup reseeded(models::mlp(), other_seed, one);
  reseeded.load(path);
  set_warning_sink(previous);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("56 samples into epoch 1 of seed 1; this run's seed is 2: that epoch starts again"),
            std::string::npos)
      << warnings[0];
  EXPECT_EQ(reseeded.epoch_samples_done(), 0);
  EXPECT_EQ(reseeded.fit(train, nullptr, 1).epochs[0].steps, 10);
  // A training set of another size has another order: the cut epoch starts again there too.
  warnings.clear();
  set_warning_sink([&](const std::string& w) { warnings.push_back(w); });
  LearnerGroup other_data(models::mlp(), stateless, one);
  other_data.load(path);
  EXPECT_EQ(other_data.epoch_samples_done(), 7 * 8);
  const TrainReport larger = other_data.fit(small_dataset(96, 4), nullptr, 1);
  set_warning_sink(previous);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("56 samples of epoch 1 were trained in the order of a training set of 80 samples; this "
                             "one has 96: that epoch starts again"),
            std::string::npos)
      << warnings[0];
  EXPECT_EQ(larger.epochs[0].steps, 12);
  std::filesystem::remove(path);
}

// A cut epoch with fewer batches left than a round of the resumed group takes (9 of 10 done, two
// learners) has nothing to train: it is done, reported as no epoch at all (it read "loss 0.0000,
// 0 samples/s" and was evaluated), and still counts as the first of the fit()'s epochs.
TEST(Checkpoint, ACutEpochWithTooFewBatchesLeftIsDoneWithoutAReport) {
  const Dataset train = small_dataset(80, 4);  // 10 batches of 8 an epoch
  const std::string path = checkpoint_path("nearly");
  LearnerGroup cut(models::mlp(), recipe(), LearnerOptions{1, 1, SmaOptions{}});
  cut.fit(train, nullptr, 1, 9);
  ASSERT_EQ(cut.epoch_samples_done(), 9 * 8);
  cut.save(path);
  LearnerGroup two(models::mlp(), recipe(), LearnerOptions{2, 1, SmaOptions{}});
  two.load(path);
  int callbacks = 0;
  two.on_epoch([&](const EpochReport& e) {
    ++callbacks;
    EXPECT_EQ(e.epoch, 2);
    return true;
  });
  const TrainReport report = two.fit(train, &train, 2);
  ASSERT_EQ(report.epochs.size(), 1u);
  EXPECT_EQ(report.epochs[0].epoch, 2);
  EXPECT_EQ(report.epochs[0].steps, 5);
  EXPECT_GT(report.epochs[0].mean_loss, 0.0);
  EXPECT_EQ(callbacks, 1);
  EXPECT_EQ(two.epochs_done(), 2);
  std::filesystem::remove(path);
}

// A save at an epoch's last round (from the progress callback that reports it, or after a fit()
// that stopped there) records the epoch done: the file loads (it read "80 samples of a cut epoch
// over a training set of 80" and was refused), and nothing is trained twice. Also under a sync
// period whose last sync is that round (period 5 of 5 rounds an epoch).
TEST(Checkpoint, ASaveAtAnEpochsLastRoundRecordsTheEpochDone) {
  const Dataset train = small_dataset(80, 4);  // 10 batches of 8 an epoch
  for (int period : {1, 5}) {
    SCOPED_TRACE(period);
    const std::string path = checkpoint_path("last-round");
    LearnerOptions options{2, 1, SmaOptions{}};
    options.sync_period = period;
    LearnerGroup group(models::mlp(), recipe(), options);
    int saves = 0;
    group.on_progress([&](const Progress& p) {
      if (!p.last) return;
      group.save(path);
      ++saves;
      throw Error("stopped after the save");
    });
    EXPECT_THROW(group.fit(train, nullptr, 1), Error);
    ASSERT_EQ(saves, 1);
    EXPECT_EQ(group.rounds_done(), 5);
    EXPECT_EQ(group.epochs_done(), 1);
    EXPECT_EQ(group.epoch_samples_done(), 0);
    LearnerGroup resumed(models::mlp(), recipe(), options);
    ASSERT_NO_THROW(resumed.load(path));
    EXPECT_EQ(resumed.epochs_done(), 1);
    EXPECT_EQ(resumed.epoch_samples_done(), 0);
    // The next fit() of one epoch trains the second epoch whole: 5 rounds, not the last again.
    group.on_progress(nullptr);
    group.fit(train, nullptr, 1);
    EXPECT_EQ(group.rounds_done(), 10);
    EXPECT_EQ(group.epochs_done(), 2);
    std::filesystem::remove(path);
  }
}

// A load is a fresh start from the file's z, whatever the group did before: a group that trained
// and one that did not step identically after loading the same checkpoint, for SMA (the
// replicas' momentum and z's last move restart) and synchronous SGD (its momentum restarts).
TEST(Checkpoint, LoadRestartsEveryMomentum) {
  Batches data(2 * 8, 23);
  for (Sync sync : {Sync::Sma, Sync::Ssgd}) {
    LearnerOptions options{2, 1, SmaOptions{}};
    options.sync = sync;
    const std::string path = checkpoint_path("momentum");
    LearnerGroup trained(models::mlp(), recipe(), options);
    for (int round = 0; round < 5; ++round) trained.round(data.images.data(), data.labels.data());
    trained.save(path);
    LearnerGroup fresh(models::mlp(), recipe(), options);
    fresh.load(path);
    trained.load(path);
    for (int round = 0; round < 2; ++round) {
      trained.round(data.images.data(), data.labels.data());
      fresh.round(data.images.data(), data.labels.data());
    }
    const Tensor &a = trained.average(), &b = fresh.average();
    for (int64_t i = 0; i < a.numel(); ++i)
      ASSERT_EQ(a.f32()[i], b.f32()[i]) << (sync == Sync::Ssgd ? "ssgd" : "sma") << " parameter " << i;
    std::filesystem::remove(path);
  }
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
  // A header that parses but holds a field of the wrong type, under a valid checksum: an error
  // naming the file, not an exception from the JSON library.
  const size_t magic = std::string("QUIVER-CHECKPOINT 1\n").size();
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data() + magic, sizeof(header_bytes));
  std::string header = bytes.substr(magic + sizeof(header_bytes), header_bytes);
  const std::string data = bytes.substr(magic + sizeof(uint64_t) + header_bytes,
                                        bytes.size() - magic - sizeof(uint64_t) - header_bytes - sizeof(uint32_t));
  // A file as the writer would have made it from this header and data, valid checksum included.
  auto crafted = [&](const std::string& head, const std::string& values) {
    std::string file = bytes.substr(0, magic);
    const uint64_t length = head.size();
    file.append(reinterpret_cast<const char*>(&length), sizeof(length));
    file += head + values;
    const uint32_t crc =
        static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(file.data()), static_cast<uInt>(file.size())));
    file.append(reinterpret_cast<const char*>(&crc), sizeof(crc));
    return file;
  };
  ASSERT_EQ(crafted(header, data), bytes);
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string head = header;
    const size_t at = head.find(from);
    EXPECT_NE(at, std::string::npos) << from << " in " << head.substr(0, 200);
    return at == std::string::npos ? head : head.replace(at, from.size(), to);
  };
  expect_rejected(crafted(edited("\"model\":\"mlp\"", "\"model\":1"), data), "unreadable header");
  // Counts are whole numbers in [0, 2^48]: a float was cut (1.5 read as 1) and 1e30 converted to
  // int64_t with undefined behaviour.
  for (const char* bad : {"-7", "1.5", "1e30", "\"3\"", "281474976710657", "18446744073709551615"})
    expect_rejected(crafted(edited("\"rounds\":0", cat("\"rounds\":", bad)), data),
                    "not a count in [0, 2^48]");
  expect_rejected(crafted(edited("\"epoch_samples\":0", "\"epoch_samples\":-1"), data), "\"epoch_samples\" is -1");
  expect_rejected(crafted(edited("\"seed\":1", "\"seed\":-1"), data), "\"seed\" is -1, not a seed");
  expect_rejected(crafted(edited("\"epochs_done\":0", "\"epochs_done\":3"), data), "3 epochs done");
  // A cut epoch's samples were trained by some round, and are fewer than its training set holds
  // (2^48 of them were taken as the last batch of the epoch).
  expect_rejected(crafted(edited("\"epoch_samples\":0", "\"epoch_samples\":8"), data),
                  "8 samples of a cut epoch after 0 rounds");
  {
    std::string head = edited("\"epoch_samples\":0", "\"data_samples\":16,\"epoch_samples\":16");
    head.replace(head.find("\"rounds\":0"), 10, "\"rounds\":5");
    expect_rejected(crafted(head, data), "16 samples of a cut epoch after 5 rounds, over a training set of 16");
  }
  // Another version of the format is named as such, not as a foreign file.
  std::string next_version = bytes;
  next_version[magic - 2] = '2';
  expect_rejected(next_version, "a Quiver checkpoint of format version \"2\"; this build reads version 1");
  expect_rejected("QUIVER-CHECKPOINT 100\n" + bytes.substr(magic), "format version \"100\"; this build reads version 1");
  expect_rejected(crafted(edited(cat("\"flat_size\":", group.average().numel()), "\"flat_size\":1e300"), data),
                  "\"flat_size\" is 1e+300, not a count");
  // A value nested a million deep (the parser reads it without recursion): named by its kind, not
  // printed, which recursed once a level and overflowed the stack.
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  expect_rejected(crafted(edited("\"rounds\":0", "\"rounds\":" + deep), data), "\"rounds\" is an array of 1,");
  expect_rejected(crafted(edited("\"seed\":1", "\"seed\":" + deep), data), "\"seed\" is an array of 1,");
  // The bytes are intact, but the model they hold had diverged: refused, not trained from.
  std::string diverged = data;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(diverged.data() + 4 * 5, &nan, sizeof(nan));
  expect_rejected(crafted(header, diverged), "parameter value 5 is nan");
  // A header of another layout under a valid checksum: a parameter renamed, or two extents of a
  // weight swapped (the same flat size), is another model's file, refused by name.
  expect_rejected(crafted(edited("\"name\":\"fc1/weight\"", "\"name\":\"fc9/weight\""), data),
                  "its parameters (names, shapes, layout) differ from model 'mlp'");
  expect_rejected(crafted(edited("[784,512]", "[512,784]"), data),
                  "its parameters (names, shapes, layout) differ from model 'mlp'");
  // Values of the wrong length under a valid checksum: refused by the size, not read past the
  // file's end. A cut file fails its checksum first, as such.
  expect_rejected(crafted(header, data.substr(4)), "truncated or the wrong size");
  expect_rejected(crafted(header, data + std::string(4, '\0')), "truncated or the wrong size");
  expect_rejected(bytes.substr(0, bytes.size() - 100), "checksum mismatch (the file is corrupted or truncated)");
  // A damaged header length is damage, not a short file.
  std::string long_header = bytes;
  long_header[magic + 3] = static_cast<char>(0x7f);
  expect_rejected(long_header, "corrupted or truncated (its header length reads");
  std::filesystem::remove(path);
  // A file larger than any checkpoint of the model (a disk image given by mistake, here sparse
  // behind a checkpoint's first bytes) is refused by its size, before it is read whole.
  {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    const std::uintmax_t largest = magic + 8 + (std::uintmax_t{64} << 20) + group.average().bytes() + 4;
    std::filesystem::resize_file(path, largest + 1);
    try {
      group.load(path);
      FAIL() << "a file of " << largest + 1 << " bytes was loaded";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(cat(largest + 1, " bytes, more than a checkpoint of model 'mlp' can hold (at most ",
                                                   largest, ")")),
                std::string::npos) << error.what();
    }
    for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(group.average().f32()[i], before[i]) << "nothing is lost";
  }
  std::filesystem::remove(path);
  // Not a file: a pipe would block the open, /dev/zero would be read for ever.
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  for (const std::string& special : {path, std::string("/dev/zero")}) {
    try {
      group.load(special);
      FAIL() << special << " was loaded";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("not a regular file"), std::string::npos) << error.what();
    }
  }
  std::filesystem::remove(path);
}

// Every cut and every byte flip (of a small model's checkpoint: 784 -> 2, about 6 KB) is refused
// with quiver::Error naming the file, and the group's z is left as it was; the whole file loads.
TEST(Checkpoint, EveryCutAndByteFlipIsRefusedAndChangesNothing) {
  auto net = std::make_shared<Sequential>();
  net->add<Linear>("fc", LinearOptions(784, 2));
  const ModelSpec tiny{"tiny", Shape{784}, [net](GraphBuilder& b, Value x) { return net->forward(b, x); }};
  const std::string path = checkpoint_path("fuzz");
  LearnerGroup group(tiny, recipe(), LearnerOptions{1, 1, SmaOptions{}});
  group.save(path);
  std::string whole;
  {
    std::ifstream in(path, std::ios::binary);
    whole.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::vector<float> before(group.average().f32(), group.average().f32() + group.average().numel());
  auto refused = [&](const std::string& content) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
    try {
      group.load(path);
      return false;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
    }
    const Tensor& z = group.average();
    for (size_t i = 0; i < before.size(); ++i)
      if (z.f32()[i] != before[i]) return false;  // a refused load must change nothing
    return true;
  };
  for (size_t length = 0; length < whole.size(); ++length)
    ASSERT_TRUE(refused(whole.substr(0, length))) << "cut to " << length << " of " << whole.size() << " bytes";
  for (size_t at = 0; at < whole.size(); ++at) {
    std::string flipped = whole;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x21);
    ASSERT_TRUE(refused(flipped)) << "byte " << at << " of " << whole.size() << " flipped";
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << whole;
  group.load(path);
  EXPECT_EQ(std::vector<float>(group.average().f32(), group.average().f32() + group.average().numel()), before);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace quiver
