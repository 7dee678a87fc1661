// SmaSync, the averaging itself (runtime/sma.h): a hand-computed 2-learner round, the round after
// momentum SGD (snapshots recovered from the velocities), blocks on several threads and shares of
// a round equal to the whole round bit for bit, bad options, the staleness bound's absorption.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "tests/error_of.h"
#include "runtime/sma.h"
#include "runtime/thread_budget.h"
#include "tests/runtime/learner_test_data.h"

namespace quiver {
namespace {

using learner_test::copy_of;
using test::error_of;

Tensor flat(std::vector<float> values) {
  Tensor t = Tensor::zeros(Shape{static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.f32());
  return t;
}

// n values drawn uniformly from [-1, 1).
Tensor uniform_buffer(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Tensor t = Tensor::zeros(Shape{n});
  for (int64_t i = 0; i < n; ++i) t.f32()[i] = uniform(rng);
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
  expect_values(w2, {1.0f, 1.65f, 3.35f}, "w2 after reset");
  // The reset cleared z's momentum: a round without local movement leaves z where it is (with
  // the last move (0, -0.1, 0.1) kept it would go on by 0.9 of it).
  Tensor u1 = copy_of(w1), u2 = copy_of(w2);
  std::vector<Tensor> snapshots3{u1, u2};
  sma.round(params2, snapshots3);
  expect_values(z, {1.0f, 1.65f, 3.35f}, "z after a still round");
  expect_values(w1, {1.0f, 1.65f, 3.35f}, "w1 after a still round");
}

// The path CPU training takes after momentum SGD: each snapshot recovered as s_j = w_j - v_j.
// Same numbers as the hand-computed example above, so the same results.
TEST(Sma, RoundAfterSgdRecoversTheSnapshotsFromTheVelocities) {
  Tensor z = flat({1, 2, 3});
  SmaSync sma(z, 2, SmaOptions{0.5, 0.9});
  Tensor w1 = flat({0.4f, 2.6f, 2.9f}), w2 = flat({1.6f, 0.9f, 3.6f});
  Tensor v1 = flat({-0.1f, 0.1f, -0.1f}), v2 = flat({0.1f, -0.1f, 0.1f});
  std::vector<Tensor> params{w1, w2}, velocities{v1, v2};
  sma.round_after_sgd(params, velocities, SerialContext());
  expect_values(w1, {0.65f, 2.35f, 2.9f}, "w1");
  expect_values(w2, {1.35f, 1.4f, 3.35f}, "w2");
  expect_values(z, {1.0f, 1.75f, 3.25f}, "z");
  std::vector<Tensor> too_few{v1};
  EXPECT_THROW(sma.round_after_sgd(params, too_few, SerialContext()), Error);
}

// Two threads that count the chunks they are handed: the pass must really be cut.
class ChunkCountingContext final : public ExecContext {
 public:
  int threads() const override { return 2; }
  void parallel_for(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& body) const override {
    threads_.parallel_for(count, grain, [&](int64_t begin, int64_t end) {
      ++chunks_;
      body(begin, end);
    });
  }
  int chunks() const { return chunks_.load(); }

 private:
  ThreadBudget threads_{2};
  mutable std::atomic<int> chunks_{0};
};

// Buffers of many blocks (18: more than one chunk of the pass's grain), three learners, the
// blocks cut into chunks over two threads: the same values as one thread, bit for bit (each
// element's arithmetic is the same whichever thread does it), and the velocity path equal to
// the snapshot path for s = w - v.
TEST(Sma, ParallelBlocksEqualOneThreadAndVelocitiesEqualSnapshots) {
  const int64_t n = 17 * 4096 + 5;
  std::mt19937 rng(7);
  auto random_buffer = [&] { return uniform_buffer(n, rng); };
  Tensor z0 = random_buffer();
  std::vector<Tensor> w0, v;
  for (int j = 0; j < 3; ++j) {
    w0.push_back(random_buffer());
    v.push_back(random_buffer());
  }
  auto copies = [](const std::vector<Tensor>& from) {
    std::vector<Tensor> to;
    for (const Tensor& t : from) to.push_back(copy_of(t));
    return to;
  };
  Tensor z_serial = copy_of(z0), z_parallel = copy_of(z0), z_snapshots = copy_of(z0);
  std::vector<Tensor> w_serial = copies(w0), w_parallel = copies(w0), w_snapshots = copies(w0);
  SmaSync serial(z_serial, 3, SmaOptions{0.3, 0.9}), parallel(z_parallel, 3, SmaOptions{0.3, 0.9}),
      from_snapshots(z_snapshots, 3, SmaOptions{0.3, 0.9});
  ChunkCountingContext two;
  for (int round = 0; round < 2; ++round) {  // the second round carries z's momentum
    serial.round_after_sgd(w_serial, v, SerialContext());
    parallel.round_after_sgd(w_parallel, v, two);
    std::vector<Tensor> s;
    for (int j = 0; j < 3; ++j) {
      s.push_back(copy_of(w_snapshots[j]));
      for (int64_t i = 0; i < n; ++i) s[j].f32()[i] -= v[j].f32()[i];
    }
    from_snapshots.round(w_snapshots, s, two);
  }
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(z_parallel.f32()[i], z_serial.f32()[i]) << "z[" << i << "]";
    ASSERT_NEAR(z_snapshots.f32()[i], z_serial.f32()[i], 1e-5) << "z[" << i << "]";
    for (int j = 0; j < 3; ++j) {
      ASSERT_EQ(w_parallel[j].f32()[i], w_serial[j].f32()[i]) << "w" << j << "[" << i << "]";
      ASSERT_NEAR(w_snapshots[j].f32()[i], w_serial[j].f32()[i], 1e-5) << "w" << j << "[" << i << "]";
    }
  }
  EXPECT_GT(two.chunks(), 4) << "two rounds of two passes, each cut into more than one chunk";
  // Not a no-op: z moved from where it started.
  double moved = 0.0;
  for (int64_t i = 0; i < n; ++i) moved += std::abs(z_serial.f32()[i] - z0.f32()[i]);
  EXPECT_GT(moved / static_cast<double>(n), 1e-2);
}

// CPU learners each take a share of the pass on their own threads (LearnerGroup::round): shares
// made at once on three threads, and two shares on two threads each (9 blocks a share, more than
// the pass's grain of 8, so each share is split again), give the whole pass's values bit for bit.
// A share that does not exist is an error.
TEST(Sma, SharesOfARoundEqualTheWholeRound) {
  const int64_t n = 17 * 4096 + 5;
  std::mt19937 rng(11);
  auto random_buffer = [&] { return uniform_buffer(n, rng); };
  const Tensor z0 = random_buffer();
  std::vector<Tensor> w0, v;
  for (int j = 0; j < 3; ++j) {
    w0.push_back(random_buffer());
    v.push_back(random_buffer());
  }
  struct Run {
    Tensor z;
    std::vector<Tensor> w;
    std::unique_ptr<SmaSync> sma;
  };
  auto start = [&] {
    Run run{copy_of(z0), {}, nullptr};
    for (const Tensor& t : w0) run.w.push_back(copy_of(t));
    run.sma = std::make_unique<SmaSync>(run.z, 3, SmaOptions{0.3, 0.9});
    return run;
  };
  Run whole = start(), three = start(), two = start();
  ThreadBudget budget(2);
  for (int round = 0; round < 2; ++round) {  // the second round carries z's momentum
    whole.sma->round_after_sgd(whole.w, v, SerialContext());
    std::vector<std::thread> threads;
    for (int share = 0; share < 3; ++share)
      threads.emplace_back([&, share] { three.sma->round_after_sgd(three.w, v, SerialContext(), SmaShare{share, 3}); });
    for (std::thread& thread : threads) thread.join();
    for (int share = 0; share < 2; ++share) two.sma->round_after_sgd(two.w, v, budget, SmaShare{share, 2});
  }
  for (const Run* run : {&three, &two})
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(run->z.f32()[i], whole.z.f32()[i]) << "z[" << i << "]";
      for (int j = 0; j < 3; ++j) ASSERT_EQ(run->w[j].f32()[i], whole.w[j].f32()[i]) << "w" << j << "[" << i << "]";
    }
  double moved = 0.0;
  for (int64_t i = 0; i < n; ++i) moved += std::abs(whole.z.f32()[i] - z0.f32()[i]);
  EXPECT_GT(moved / static_cast<double>(n), 1e-2);
  EXPECT_THROW(whole.sma->round_after_sgd(whole.w, v, SerialContext(), SmaShare{3, 3}), Error);
  EXPECT_THROW(whole.sma->round(whole.w, v, SerialContext(), SmaShare{0, 0}), Error);
}

TEST(Sma, RejectsBadOptions) {
  Tensor z = flat({1, 2});
  EXPECT_THROW(SmaSync(z, 0, SmaOptions{}), Error);
  EXPECT_THROW(SmaSync(z, 2, SmaOptions{1.5, 0.9}), Error);
  EXPECT_THROW(SmaSync(z, 2, SmaOptions{0.5, 1.0}), Error);
  // In [0, 1) as doubles, but not as the floats the round computes in: mu_z 1.0f would never
  // let the average's momentum decay, and a subnormal alpha is read as 0.
  EXPECT_NE(error_of([&] { SmaSync(z, 2, SmaOptions{0.5, 0.99999999}); }).find("mu_z 0.99999999 rounds to 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { SmaSync(z, 2, SmaOptions{1e-39, 0.9}); }).find("alpha 1e-39 is below the smallest normal"),
            std::string::npos);
  EXPECT_EQ(SmaSync(z, 2, SmaOptions{0.0, 0.99999994}).alpha(), 0.0);  // the largest float below 1, and alpha 0
  EXPECT_DOUBLE_EQ(SmaSync(z, 4, SmaOptions{}).alpha(), 0.25);  // default: 1/k
  SmaSync sma(z, 2, SmaOptions{});
  Tensor w = flat({1, 2, 3});
  // One snapshot short, every buffer of the right size: refused for the count (a size error
  // elsewhere could not stand in for it), before snapshots[1] is read past the span.
  Tensor good = flat({1, 2}), good_too = flat({1, 2});
  const std::vector<Tensor> two{good, good_too}, one{good};
  EXPECT_NE(error_of([&] { sma.round(two, one); }).find("expected 2 learners' parameters and snapshots, got 2 and 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { sma.round(one, one); }).find("got 1 and 1"), std::string::npos);
  // The right number of buffers, one of the wrong size: refused before anything is read past it.
  std::vector<Tensor> one_long{good, w}, two_good{good, good_too};
  EXPECT_NE(error_of([&] { sma.round(one_long, two_good); }).find("learner 1 has 3 parameters"), std::string::npos)
      << error_of([&] { sma.round(one_long, two_good); });
  EXPECT_NE(error_of([&] { sma.round(two_good, one_long); }).find("a snapshot of 3"), std::string::npos);
  EXPECT_NE(error_of([&] { sma.round_after_sgd(one_long, two_good, SerialContext()); }).find("learner 1 has 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { sma.round_after_sgd(two_good, one_long, SerialContext()); }).find("3 velocities"),
            std::string::npos);
  expect_values(z, {1.0f, 2.0f}, "z after refused rounds");
}

// Bounded staleness: each learner absorbs its correction into z as it arrives, against z as the
// learners before it left it. Same numbers as above, learner 1 first, then learner 2, then
// learner 1 again without local movement.
TEST(Sma, AbsorbMatchesAHandComputedExample) {
  for (bool from_velocity : {false, true}) {
    Tensor z = flat({1, 2, 3});
    SmaSync sma(z, 2, SmaOptions{0.5, 0.9}, /*absorbing=*/true);
    Tensor w1 = flat({0.4f, 2.6f, 2.9f}), w2 = flat({1.6f, 0.9f, 3.6f});
    // The snapshot, or the velocity of a momentum-SGD step (w = s + v).
    Tensor o1 = from_velocity ? flat({-0.1f, 0.1f, -0.1f}) : flat({0.5f, 2.5f, 3.0f});
    Tensor o2 = from_velocity ? flat({0.1f, -0.1f, 0.1f}) : flat({1.5f, 1.0f, 3.5f});
    sma.absorb(0, w1, o1, from_velocity, SerialContext());
    // c1 = 0.5 (s1 - z) = (-0.25, 0.25, 0): w1 moves back by it, z forward.
    expect_values(w1, {0.65f, 2.35f, 2.9f}, "w1");
    expect_values(z, {0.75f, 2.25f, 3.0f}, "z after learner 1");
    sma.absorb(1, w2, o2, from_velocity, SerialContext());
    // c2 = 0.5 (s2 - z) = (0.375, -0.625, 0.25) against the z learner 1 left.
    expect_values(w2, {1.225f, 1.525f, 3.35f}, "w2");
    expect_values(z, {1.125f, 1.625f, 3.25f}, "z after learner 2");
    // Learner 1's turn carries z's momentum: the last round's move d = c1 + c2 = (0.125, -0.375,
    // 0.25); c1 = 0.5 (w1 - z) = (-0.2375, 0.3625, -0.175); z += c1 + 0.9 d.
    Tensor o3 = from_velocity ? flat({0.0f, 0.0f, 0.0f}) : flat({0.65f, 2.35f, 2.9f});
    sma.absorb(0, w1, o3, from_velocity, SerialContext());
    expect_values(w1, {0.8875f, 1.9875f, 3.075f}, "w1 again");
    expect_values(z, {1.0f, 1.65f, 3.3f}, "z after learner 1 again");
  }
  Tensor z = flat({1, 2, 3});
  SmaSync sma(z, 2, SmaOptions{0.5, 0.0}, true);
  EXPECT_THROW(sma.absorb(2, z, z, false, SerialContext()), Error);  // no learner 2 of 2
  EXPECT_THROW(sma.absorb(0, flat({1, 2}), flat({1, 2}), false, SerialContext()), Error);
  SmaSync synchronous(z, 2, SmaOptions{0.5, 0.0});
  EXPECT_THROW(synchronous.absorb(0, z, z, false, SerialContext()), Error);  // not made for absorbing
}

// What an absorbing SmaSync carries between turns (z's last move, and what z absorbed since
// learner 0's last turn): a group rebuilt for another learner count goes on with both
// (continue_from), a learning-rate drop clears both (reset_replicas).
TEST(Sma, AContinuationKeepsAndAResetClearsWhatAbsorbingCarries) {
  // Three turns of the example above leave a last move and an absorbed correction behind.
  auto after_three_turns = [](Tensor z, Tensor w1, Tensor w2) {
    auto sma = std::make_unique<SmaSync>(z, 2, SmaOptions{0.5, 0.9}, /*absorbing=*/true);
    sma->absorb(0, w1, flat({0.5f, 2.5f, 3.0f}), false, SerialContext());
    sma->absorb(1, w2, flat({1.5f, 1.0f, 3.5f}), false, SerialContext());
    sma->absorb(0, w1, copy_of(w1), false, SerialContext());
    return sma;
  };
  // Two more still turns (w = s), learner 1 then learner 0 (whose turn applies z's momentum).
  auto two_still_turns = [](SmaSync& sma, const Tensor& w1, const Tensor& w2) {
    sma.absorb(1, w2, copy_of(w2), false, SerialContext());
    sma.absorb(0, w1, copy_of(w1), false, SerialContext());
  };
  Tensor z = flat({1, 2, 3}), w1 = flat({0.4f, 2.6f, 2.9f}), w2 = flat({1.6f, 0.9f, 3.6f});
  std::unique_ptr<SmaSync> sma = after_three_turns(z, w1, w2);
  // The rebuilt group's SmaSync over copies of the same buffers, continued from the first.
  Tensor z_next = copy_of(z), w1_next = copy_of(w1), w2_next = copy_of(w2);
  SmaSync next(z_next, 2, SmaOptions{0.5, 0.9}, true);
  next.continue_from(*sma);
  // One made at the same z without continuing, to show that the carried state matters here.
  Tensor z_fresh = copy_of(z), w1_fresh = copy_of(w1), w2_fresh = copy_of(w2);
  SmaSync fresh(z_fresh, 2, SmaOptions{0.5, 0.9}, true);
  two_still_turns(*sma, w1, w2);
  two_still_turns(next, w1_next, w2_next);
  two_still_turns(fresh, w1_fresh, w2_fresh);
  double fresh_differs = 0.0;
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(z_next.f32()[i], z.f32()[i]) << "z[" << i << "]";
    EXPECT_EQ(w1_next.f32()[i], w1.f32()[i]) << "w1[" << i << "]";
    EXPECT_EQ(w2_next.f32()[i], w2.f32()[i]) << "w2[" << i << "]";
    fresh_differs += std::abs(z_fresh.f32()[i] - z.f32()[i]);
  }
  EXPECT_GT(fresh_differs, 1e-3);

  // A reset: every replica becomes z, and still turns leave z where it is.
  Tensor z_reset = flat({1, 2, 3}), w1_reset = flat({0.4f, 2.6f, 2.9f}), w2_reset = flat({1.6f, 0.9f, 3.6f});
  std::unique_ptr<SmaSync> reset = after_three_turns(z_reset, w1_reset, w2_reset);
  std::vector<Tensor> replicas{w1_reset, w2_reset};
  reset->reset_replicas(replicas);
  const Tensor at_reset = copy_of(z_reset);
  two_still_turns(*reset, w1_reset, w2_reset);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(z_reset.f32()[i], at_reset.f32()[i]) << "z[" << i << "] after a reset";
    EXPECT_EQ(w1_reset.f32()[i], at_reset.f32()[i]) << "w1[" << i << "] after a reset";
  }
}

}  // namespace
}  // namespace quiver
