// Bounded staleness (LearnerOptions::staleness): the clock gate (CpuStream::wait_at_most) and the
// bound it keeps a held learner to, one learner equal to synchronous SMA, learners rounds apart
// converging, the options checked, and errors surfacing at a later round without leaving a batch
// in use. Synchronous learners: test_learners.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include <unistd.h>

#include "core/error.h"
#include "core/op.h"
#include "ops/kernel_util.h"
#include "models/models.h"
#include "runtime/cpu_stream.h"
#include "runtime/learners.h"
#include "tests/runtime/learner_test_data.h"

namespace quiver {
namespace {

using learner_test::Batches;
using learner_test::recipe;
using learner_test::small_dataset;
using learner_test::stale;
using learner_test::step_named;

// The clock gate of bounded staleness: wait_at_most(n) returns only once n or fewer pieces of
// work are left (here one blocks the stream, so it cannot return before it is released).
TEST(CpuStream, WaitAtMostReturnsOnceFewEnoughAreLeft) {
  CpuStream stream;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> done{0};
  stream.submit([released] { released.wait(); });
  for (int i = 0; i < 3; ++i) stream.submit([&done] { ++done; });
  std::atomic<bool> returned{false};
  std::atomic<int> done_at_return{-1};
  std::thread waiter([&] {
    stream.wait_at_most(1);
    done_at_return = done.load();
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load());  // four left: the blocked one and three behind it
  stream.wait_at_most(4);         // four left: returns at once
  release.set_value();
  waiter.join();
  EXPECT_GE(done_at_return.load(), 2);  // at most one was left when it returned
  stream.wait();
  EXPECT_EQ(done.load(), 3);
  stream.submit([] { throw Error("deliberate"); });
  stream.submit([] {});
  EXPECT_THROW(stream.wait_at_most(0), Error);
}

// An identity op that, off the thread that called round() (learner 0 runs its steps there, the
// others on their streams' threads), waits until the test opens `latch`: learner 1 is held still.
std::atomic<std::thread::id> caller_thread{};
std::atomic<int> caller_steps{0};  // steps learner 0 has started
std::shared_future<void> latch;
const bool registered_latched_op = [] {
  OpDef def;
  def.kind = "test_latched_off_the_caller";
  def.infer = [](const InferContext& ctx) { return std::vector<TensorType>{ctx.inputs[0]}; };
  def.kernels.push_back(cpu_kernel("reference", [](const KernelCall& call) {
    if (std::this_thread::get_id() != caller_thread.load())
      latch.wait();
    else
      ++caller_steps;
    call.outputs[0].copy_from(call.inputs[0]);
  }));
  return register_op(std::move(def));
}();

// The bound itself: with learner 1 held still in its first step, round() returns s times at
// bound s (learner 1 then has s rounds' work pending, the most the bound allows) and the next
// blocks until learner 1 moves on; at s = 0 the first round blocks. A correct gate passes however
// slow the host; only a broken one could slip past the wait before counting unnoticed.
ModelSpec held_mlp() {
  ModelSpec held = models::mlp();
  held.name = "held mlp";
  held.build = [mlp = models::mlp().build](GraphBuilder& b, Value x) {
    return mlp(b, b.apply("test_latched_off_the_caller", {x}, {}, "latched")[0]);
  };
  return held;
}

TEST(Learners, NoLearnerFallsMoreThanTheBoundBehind) {
  Batches data(2 * 8, 43);
  for (int staleness : {0, 1, 3}) {
    SCOPED_TRACE(staleness);
    LearnerGroup group(held_mlp(), recipe(), stale(2, staleness));
    std::promise<void> open;
    latch = open.get_future().share();
    std::atomic<int> returned{0};
    caller_steps = 0;
    std::thread driver([&] {
      caller_thread = std::this_thread::get_id();
      for (int round = 0; round < staleness + 3; ++round) {
        group.round(data.images.data(), data.labels.data());
        ++returned;
      }
    });
    // The s rounds the bound lets through and learner 0's step of the next (seconds under a
    // sanitizer), then time for that step to end and a broken gate to let its round return.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (caller_steps.load() < staleness + 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(returned.load(), staleness) << "rounds returned while learner 1 was held in its first step";
    open.set_value();
    driver.join();
    EXPECT_EQ(returned.load(), staleness + 3);
    EXPECT_EQ(group.rounds_done(), staleness + 3);
  }
}

// Under a staleness bound a learner's error surfaces at a later round, or at the next settle. A
// load() is the recovery from it (a NaN loss): it drops that error and loads, rather than throw it
// and load nothing (which took a second call).
TEST(Learners, ALoadDropsALearnersErrorFromBeforeIt) {
  const std::string path = ::testing::TempDir() + "quiver-stale-load-" + std::to_string(::getpid()) + ".ckpt";
  Batches good(2 * 8, 47), poisoned(2 * 8, 47);
  std::fill(poisoned.images.begin() + 8 * 784, poisoned.images.end(), std::numeric_limits<float>::quiet_NaN());
  caller_thread = std::this_thread::get_id();
  std::promise<void> open_now;
  open_now.set_value();
  latch = open_now.get_future().share();
  LearnerGroup group(held_mlp(), recipe(), stale(2, 2));
  group.round(good.images.data(), good.labels.data());
  group.save(path);
  const Tensor saved = learner_test::copy_of(group.average());
  // Learner 1 is held until round() has returned, then fails (a NaN loss): only a later call sees it.
  std::promise<void> open_later;
  latch = open_later.get_future().share();
  ASSERT_NO_THROW(group.round(poisoned.images.data(), poisoned.labels.data()));
  open_later.set_value();
  ASSERT_NO_THROW(group.load(path));
  for (int64_t i = 0; i < saved.numel(); ++i) ASSERT_EQ(group.average().f32()[i], saved.f32()[i]) << i;
  EXPECT_NO_THROW(group.round(good.images.data(), good.labels.data()));
  EXPECT_NO_THROW(group.average());
  std::remove(path.c_str());
}

// One learner has nobody to be stale against: with a staleness bound its corrections and z's
// momentum are the synchronous ones, bit for bit.
TEST(Learners, StalenessWithOneLearnerIsSynchronousSma) {
  Batches data(8);
  LearnerGroup synchronous(models::mlp(), recipe(), stale(1, 0, 0.5));
  LearnerGroup bounded(models::mlp(), recipe(), stale(1, 3, 0.5));
  for (int round = 0; round < 10; ++round)
    EXPECT_EQ(bounded.round(data.images.data(), data.labels.data()),
              synchronous.round(data.images.data(), data.labels.data()));
  const Tensor &a = bounded.average(), &b = synchronous.average();
  EXPECT_EQ(std::vector<float>(a.f32(), a.f32() + a.numel()), std::vector<float>(b.f32(), b.f32() + b.numel()));
  const Tensor &wa = bounded.replica(0).flat_params(), &wb = synchronous.replica(0).flat_params();
  EXPECT_EQ(std::vector<float>(wa.f32(), wa.f32() + wa.numel()), std::vector<float>(wb.f32(), wb.f32() + wb.numel()));
}

// Learners up to two rounds apart still converge, through round() and through fit() (which keeps
// the batches of rounds still running), and z, read after they settle, classifies well.
TEST(Learners, LearnersWithinAStalenessBoundConverge) {
  Batches data(2 * 8, 11);
  TrainOptions train = recipe();
  train.learning_rate = 0.05;
  LearnerGroup group(models::mlp(), train, stale(2, 2));
  EXPECT_EQ(group.staleness(), 2);
  const double start = group.round(data.images.data(), data.labels.data());
  for (int round = 0; round < 150; ++round) group.round(data.images.data(), data.labels.data());
  group.settle();
  const double loss = group.round(data.images.data(), data.labels.data());
  EXPECT_LT(loss, 0.2 * start);
  const Dataset samples = small_dataset(16, 11);  // data's samples
  EXPECT_GT(group.evaluate(samples), 0.8);

  // Three learners really two rounds apart act as extra momentum on top of the learners' and z's
  // 0.9: at lr 0.05 a busy machine (CI, with another process beside it: 2 of 60 runs) saw the
  // loss reach 0.01 and then swing up past its first epoch's. At 0.02 none of 80 such runs did.
  train.learning_rate = 0.02;
  LearnerGroup fitted(models::mlp(), train, stale(3, 2));
  const Dataset more = small_dataset(6 * 8, 13);
  TrainReport report = fitted.fit(more, &more, 30);
  EXPECT_EQ(report.steps, 30 * 2);
  EXPECT_LT(report.epochs.back().mean_loss, 0.5 * report.epochs.front().mean_loss);
  EXPECT_GT(report.epochs.back().test_accuracy, 0.8);
}

TEST(Learners, StalenessOptionsAreChecked) {
  auto refused = [](TrainOptions train, LearnerOptions options, const char* expected) {
    try {
      LearnerGroup group(models::mlp(), train, options);
      ADD_FAILURE() << "accepted: " << expected;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  };
  refused(recipe(), stale(2, -1), "staleness: must be in [0, 64]");
  refused(recipe(), stale(2, kMaxStaleness + 1), "staleness: must be in [0, 64]");
  LearnerOptions ssgd = stale(2, 1);
  ssgd.sync = Sync::Ssgd;
  refused(recipe(), ssgd, "needs --sync sma");
  TrainOptions on_gpu = recipe();
  on_gpu.device = Device::cuda(0);
  refused(on_gpu, stale(2, 1), "CPU learners only");
  // A diverging learner's NaN loss reaches the caller from its stream: at a later round or when
  // the learners settle, never lost.
  Batches data(2 * 8);
  TrainOptions train = recipe();
  train.learning_rate = 1e30;
  LearnerGroup group(models::mlp(), train, stale(2, 2));
  try {
    for (int round = 0; round < 10; ++round) group.round(data.images.data(), data.labels.data());
    group.settle();
    FAIL() << "a diverging run must stop";
  } catch (const Error& error) {
    EXPECT_GE(step_named(error), 1) << error.what();
    EXPECT_LE(step_named(error), 10) << error.what();
  }
  // The same error leaving fit() while learners are rounds behind: they finish before fit()'s
  // batches and batcher are freed (the ASan preset would report a use after free otherwise).
  LearnerGroup behind(models::mlp(), train, stale(4, 8));
  try {
    behind.fit(small_dataset(640, 3), nullptr, 1);
    FAIL() << "a diverging run must stop";
  } catch (const Error& error) {
    EXPECT_GE(step_named(error), 1) << error.what();
    EXPECT_LE(step_named(error), 640 / 8) << error.what();  // a learner's steps: at most the epoch's batches
  }
}

// The batches a staleness bound keeps for learners still running them (the last S + 1 rounds')
// count in the memory check: within a limit that holds two replicas, five rounds' batches and the
// feeder's, a bound of 64 rounds at batch 256 (about 100 MiB of batches) is refused up front,
// naming them.
TEST(Learners, TheBatchesAStalenessBoundHoldsCountInTheMemoryCheck) {
  TrainOptions train = recipe();
  train.batch = 256;
  train.eval_batch = 1;  // as a replica's (LearnerGroup builds them so), and z's here too
  const int64_t each = learner_bytes(Trainer(models::mlp(), train), true);
  train.memory_limit = 2 * each + (int64_t{24} << 20);
  const auto two = [](int staleness) {
    LearnerOptions options = stale(2, staleness);
    options.max_learners = 2;  // the feeder's queue: 8 batches (the default, the host's cores, sets more)
    return options;
  };
  EXPECT_NO_THROW(LearnerGroup(models::mlp(), train, two(0)));
  EXPECT_NO_THROW(LearnerGroup(models::mlp(), train, two(4)));  // 5 rounds of 2 x 0.8 MB
  try {
    LearnerGroup group(models::mlp(), train, two(kMaxStaleness));
    FAIL() << "65 rounds of two batches of 256 images do not fit in " << train.memory_limit << " bytes";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("learners: 2 replicas of 'mlp' at batch 256 need about "), std::string::npos) << message;
    EXPECT_NE(message.find(" MiB the batches of the last 65 rounds, for the staleness bound"), std::string::npos)
        << message;
  }
}

// Under a staleness bound a learner's error surfaces at a later round; the round that throws it
// lets every learner finish what it was given first, so the caller may free every round's batches
// at once. (Before, tasks still queued read them after they were freed: the ASan preset shows it.)
TEST(Learners, ARoundThatThrowsLeavesNoBatchInUse) {
  TrainOptions train = recipe();
  train.learning_rate = 1e30;  // diverges within a few rounds
  for (int learners : {2, 3}) {
    LearnerGroup group(models::mlp(), train, stale(learners, 2));
    std::deque<std::unique_ptr<Batches>> alive;
    bool thrown = false;
    for (int round = 0; round < 30 && !thrown; ++round) {
      alive.push_back(std::make_unique<Batches>(learners * 8, 40 + round));
      try {
        group.round(alive.back()->images.data(), alive.back()->labels.data());
      } catch (const Error&) {
        thrown = true;
        alive.clear();  // every batch freed at once
      }
      if (alive.size() > 3) alive.pop_front();  // the last s + 1 rounds' batches kept, as round() asks
    }
    EXPECT_TRUE(thrown) << learners << " learners";
    EXPECT_NO_THROW(group.settle()) << "nothing left running, no error left behind";
  }
}

}  // namespace
}  // namespace quiver
