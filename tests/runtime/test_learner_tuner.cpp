// The learner-count tuner's decisions, fed windows of chosen samples/s: Crossbow's rule (add a
// learner while samples/s rises by more than the threshold, then keep the best), a close call
// measured twice in A B B A order, a refused configuration, and the leap over a plateau.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "core/error.h"
#include "runtime/learner_tuner.h"

namespace quiver {
namespace {

// Gains clearly above the threshold decided on one window (confirm_gains off) and no leap over a
// plateau, so each test feeds only the windows its rule asks for; EveryGainIsConfirmedByDefault
// and the leap tests cover the defaults.
TunerOptions on_cores(int cores, int max_learners) {
  TunerOptions options;
  options.cores = cores;
  options.max_learners = max_learners;
  options.confirm_gains = false;
  options.leap = false;
  return options;
}

// The default options (every gain confirmed, the leap over a plateau) on `cores` cores, at most
// one learner a core.
TunerOptions by_default(int cores) {
  TunerOptions options;
  options.cores = cores;
  options.max_learners = cores;
  return options;
}

// Feeds `rates` as windows of whatever the tuner asks for; returns what it measured, in order,
// as learner counts (a kept configuration appended last).
std::vector<int> run(LearnerTuner& tuner, const std::vector<double>& rates) {
  std::vector<int> measured;
  for (double rate : rates) {
    if (tuner.settled()) break;
    measured.push_back(tuner.current().learners);
    tuner.measured(rate);
  }
  return measured;
}

TEST(LearnerTuner, AddsLearnersWhileTheGainIsClearlyAboveTheThreshold) {
  LearnerTuner tuner(on_cores(8, 8));
  EXPECT_EQ(tuner.current().learners, 1);
  EXPECT_EQ(tuner.current().threads_per_learner, 8);
  // 1: 100, 2: 150 (+50%), 3: 240 (+60%), 4: 200 (worse): keep 3 learners, threads split evenly.
  EXPECT_EQ(run(tuner, {100, 150, 240, 200}), (std::vector<int>{1, 2, 3, 4}));
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 3);
  EXPECT_EQ(tuner.current().threads_per_learner, 2);  // 8 cores / 3
  EXPECT_EQ(tuner.history().back().learners, 3);
  EXPECT_DOUBLE_EQ(tuner.history().back().samples_per_second, 240);
  EXPECT_EQ(tuner.history().size(), 5u);  // four windows, then the kept configuration
}

TEST(LearnerTuner, AClearLossStopsAtOnce) {
  LearnerTuner tuner(on_cores(2, 4));
  EXPECT_EQ(run(tuner, {100, 70}), (std::vector<int>{1, 2}));
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 1);
  EXPECT_EQ(tuner.current().threads_per_learner, 2);
}

// A gain of +12% (inside 10% +- 10 points) is measured again: the candidate at once, then the best
// so far, and the means decide. Here the second windows show the first was luck: keep 1 learner.
TEST(LearnerTuner, ACloseCallIsMeasuredTwiceAndTheMeansDecide) {
  LearnerTuner tuner(on_cores(2, 4));
  EXPECT_EQ(run(tuner, {100, 112, 100, 104}), (std::vector<int>{1, 2, 2, 1}));
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 1);
  const std::vector<TunerStep>& history = tuner.history();
  ASSERT_EQ(history.size(), 5u);
  EXPECT_FALSE(history[1].again);
  EXPECT_TRUE(history[2].again);
  EXPECT_TRUE(history[3].again);
  EXPECT_DOUBLE_EQ(history.back().samples_per_second, 104);  // the faster of 100 and 104

  // The same close call, confirmed (2 learners: 115 and 121 against 100 and 102): 2 learners win
  // and the tuner goes on to 3, comparing with their faster window, 121.
  LearnerTuner confirmed(on_cores(2, 4));
  EXPECT_EQ(run(confirmed, {100, 115, 121, 102, 90}), (std::vector<int>{1, 2, 2, 1, 3}));
  ASSERT_TRUE(confirmed.settled());
  EXPECT_EQ(confirmed.current().learners, 2);
  EXPECT_EQ(confirmed.current().threads_per_learner, 1);
  EXPECT_DOUBLE_EQ(confirmed.history().back().samples_per_second, 121);
}

// Gains far from the threshold are not measured twice; a band of 0 never measures twice.
TEST(LearnerTuner, OnlyCloseCallsAreMeasuredTwice) {
  LearnerTuner clear(on_cores(4, 4));
  EXPECT_EQ(run(clear, {100, 125, 100}), (std::vector<int>{1, 2, 3}));
  TunerOptions no_band = on_cores(4, 4);
  no_band.confirm_band = 0.0;
  LearnerTuner once(no_band);
  EXPECT_EQ(run(once, {100, 112, 100}), (std::vector<int>{1, 2, 3}));
  ASSERT_TRUE(once.settled());
  EXPECT_EQ(once.current().learners, 2);
}

// By default every gain above the threshold is measured twice like a close call (A B B A), however
// large: a best's window taken while the host was slow makes the next configuration look far
// better. Here 2 learners' +33% was that (the second windows read 7100 against 7700: keep 1); a
// true gain is confirmed and kept, and the tuner goes on from it.
TEST(LearnerTuner, EveryGainIsConfirmedByDefault) {
  LearnerTuner fluke(by_default(2));
  EXPECT_EQ(run(fluke, {5665, 7522, 7100, 7700}), (std::vector<int>{1, 2, 2, 1}));
  ASSERT_TRUE(fluke.settled());
  EXPECT_EQ(fluke.current().learners, 1);
  EXPECT_TRUE(fluke.history()[2].again);
  EXPECT_DOUBLE_EQ(fluke.history().back().samples_per_second, 7700);

  LearnerTuner real(by_default(4));
  // 3 learners' 150 is a loss against 200; the leap to 4 loses too (160): keep 2.
  EXPECT_EQ(run(real, {100, 200, 190, 105, 150, 160}), (std::vector<int>{1, 2, 2, 1, 3, 4}));
  ASSERT_TRUE(real.settled());
  EXPECT_EQ(real.current().learners, 2);
  EXPECT_DOUBLE_EQ(real.history().back().samples_per_second, 200);
  // A loss is not confirmed (nor is the leap's).
  LearnerTuner loss(by_default(4));
  EXPECT_EQ(run(loss, {100, 80, 90}), (std::vector<int>{1, 2, 4}));
  EXPECT_TRUE(loss.settled());
  EXPECT_EQ(loss.current().learners, 1);
}

// The 16-core host's curve (MLP, batch 16: 2 learners gain nothing, 4 learners 1.2x, 16 learners
// 2.8x): one more learner at a time would stop at 1. Each count that fails to gain is followed by
// a leap to twice that count; a gain there becomes the best and growth goes on by one.
TunerOptions leaping(int cores) {
  TunerOptions options = on_cores(cores, cores);
  options.leap = true;
  options.confirm_band = 0.0;  // each window decides: the sequence below is the rule's alone
  return options;
}

TEST(LearnerTuner, LeapsOverAPlateau) {
  LearnerTuner tuner(leaping(16));
  // 1: 100; 2: 97 fails; leap to 4: 122 wins; 5: 130 fails (+7%); leap to 10: 200 wins; 11: 205
  // fails; leap to 16 (22 capped at the cores): 276 wins; 17 is past the most: keep 16.
  EXPECT_EQ(run(tuner, {100, 97, 122, 130, 200, 205, 276}), (std::vector<int>{1, 2, 4, 5, 10, 11, 16}));
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 16);
  EXPECT_EQ(tuner.current().threads_per_learner, 1);
  const std::vector<TunerStep>& history = tuner.history();
  ASSERT_EQ(history.size(), 8u);
  std::vector<int> leaps;
  for (const TunerStep& step : history)
    if (step.leap) leaps.push_back(step.learners);
  EXPECT_EQ(leaps, (std::vector<int>{4, 10, 16}));
  EXPECT_EQ(history[2].threads_per_learner, 4);  // 16 cores / 4
  EXPECT_EQ(history[4].threads_per_learner, 1);  // 16 cores / 10
  EXPECT_FALSE(history.back().leap);
}

// A leap that fails settles at the best; where twice the failed count is no new configuration (2
// cores: 2 learners are the most), the tuner settles as without leaps.
TEST(LearnerTuner, AFailedLeapSettlesAndTwoCoresNeverLeap) {
  LearnerTuner failed(leaping(8));
  EXPECT_EQ(run(failed, {100, 90, 105}), (std::vector<int>{1, 2, 4}));
  ASSERT_TRUE(failed.settled());
  EXPECT_EQ(failed.current().learners, 1);
  EXPECT_DOUBLE_EQ(failed.history().back().samples_per_second, 100);

  // From a best of 2, 3 fails and the leap goes to 6; that fails too: keep 2.
  LearnerTuner later(leaping(8));
  EXPECT_EQ(run(later, {100, 150, 150, 140}), (std::vector<int>{1, 2, 3, 6}));
  EXPECT_EQ(later.current().learners, 2);

  LearnerTuner two(leaping(2));
  EXPECT_EQ(run(two, {100, 105}), (std::vector<int>{1, 2}));
  ASSERT_TRUE(two.settled());
  EXPECT_EQ(two.current().learners, 1);
}

// A leap, like any gain, is confirmed by default (A B B A: the leap again, then the best again).
TEST(LearnerTuner, ALeapsGainIsConfirmedByDefault) {
  LearnerTuner tuner(by_default(4));
  // 2 learners: a close call (105, 104 against 100, 101) that loses; the leap to 4 gains (150,
  // 148 against 101's second look, 99): keep 4.
  EXPECT_EQ(run(tuner, {100, 105, 104, 101, 150, 148, 99}), (std::vector<int>{1, 2, 2, 1, 4, 4, 1}));
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 4);
  EXPECT_DOUBLE_EQ(tuner.history().back().samples_per_second, 150);
}

// A bound at or below the bar counts as a loss: the leap comes next, and a leap bounded in turn
// settles. A leap that reads as a clear loss may be cut short, and settles too.
TEST(LearnerTuner, ABoundOrACutShortWindowCountsAsALossForTheLeap) {
  LearnerTuner bounded(leaping(8));
  bounded.measured(100);
  ASSERT_EQ(bounded.current().learners, 2);
  EXPECT_TRUE(bounded.bounded(105));  // 2 learners cannot gain 10%: leap to 4
  ASSERT_FALSE(bounded.settled());
  EXPECT_EQ(bounded.current().learners, 4);
  EXPECT_TRUE(bounded.current().leap);
  EXPECT_FALSE(bounded.bounded(200));  // 4 learners could: measure them
  bounded.measured(150);
  EXPECT_EQ(bounded.current().learners, 5);  // the leap gained: on by one from it

  LearnerTuner both(leaping(8));
  both.measured(100);
  EXPECT_TRUE(both.bounded(105));
  EXPECT_TRUE(both.bounded(108));  // the leap's bound is no gain either
  ASSERT_TRUE(both.settled());
  EXPECT_EQ(both.current().learners, 1);
  const std::vector<TunerStep>& history = both.history();
  ASSERT_EQ(history.size(), 4u);  // 1, 2 (bounded), 4 (bounded leap), the kept 1
  EXPECT_TRUE(history[1].bounded);
  EXPECT_TRUE(history[2].bounded && history[2].leap);

  LearnerTuner cut(by_default(8));
  cut.measured(100);
  cut.measured(90);  // 2 learners: a clear loss; leap to 4
  ASSERT_EQ(cut.current().learners, 4);
  EXPECT_TRUE(cut.losing(80));
  cut.measured_cut_short(80);
  ASSERT_TRUE(cut.settled());
  EXPECT_EQ(cut.current().learners, 1);
}

// A refused leap (it would not fit in memory) settles at the best, which current() then names
// although the group still runs the failed configuration: the caller returns to the best, and if
// that is refused too, the tuner keeps where the group is.
TEST(LearnerTuner, ARefusedLeapSettlesAtTheBest) {
  LearnerTuner tuner(leaping(8));
  EXPECT_EQ(run(tuner, {100, 90}), (std::vector<int>{1, 2}));
  ASSERT_EQ(tuner.current().learners, 4);
  ASSERT_TRUE(tuner.current().leap);
  tuner.refused();
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 1);
  EXPECT_DOUBLE_EQ(tuner.history().back().samples_per_second, 100);
  tuner.refused();  // the way back to 1 learner would not fit either
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 2);
  EXPECT_DOUBLE_EQ(tuner.history().back().samples_per_second, 90);

  // A leap that gained is confirmed (the leap again, then the best again); the way back to the
  // best for that second look is refused: the group stays at the leap, and so does the tuner.
  LearnerTuner confirmed(by_default(8));
  EXPECT_EQ(run(confirmed, {100, 90, 150, 148}), (std::vector<int>{1, 2, 4, 4}));
  ASSERT_EQ(confirmed.current().learners, 1);
  confirmed.refused();
  ASSERT_TRUE(confirmed.settled());
  EXPECT_EQ(confirmed.current().learners, 4);
  EXPECT_DOUBLE_EQ(confirmed.history().back().samples_per_second, 150);
}

TEST(LearnerTuner, StopsAtTheMostLearnersAndWhenRefused) {
  LearnerTuner capped(on_cores(4, 2));
  EXPECT_EQ(run(capped, {100, 200}), (std::vector<int>{1, 2}));
  ASSERT_TRUE(capped.settled());
  EXPECT_EQ(capped.current().learners, 2);

  LearnerTuner refused(on_cores(4, 8));
  run(refused, {100, 200});
  EXPECT_EQ(refused.current().learners, 3);  // asked for; it would not fit in memory
  refused.refused();
  ASSERT_TRUE(refused.settled());
  EXPECT_EQ(refused.current().learners, 2);
  EXPECT_EQ(refused.history().back().learners, 2);
}

// With the defaults every gain is confirmed A B B A, so when B wins the group is running A (its
// second window) while the tuner asks for B + 1. A refused B + 1 keeps B, the best, which the caller
// returns to (it kept A, which had lost, before); refused again, the group stays at A.
TEST(LearnerTuner, ARefusedGrowthAfterAConfirmedGainKeepsTheWinner) {
  LearnerTuner tuner(by_default(4));
  EXPECT_EQ(run(tuner, {100, 200, 200, 100}), (std::vector<int>{1, 2, 2, 1}));
  ASSERT_EQ(tuner.current().learners, 3);  // asked for; it would not fit in memory
  tuner.refused();
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 2);
  EXPECT_EQ(tuner.current().threads_per_learner, 2);
  EXPECT_DOUBLE_EQ(tuner.history().back().samples_per_second, 200);
  tuner.refused();  // the way back to 2 x 2 is refused too: where the group is
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 1);
}

// The kept configuration is reported with the fastest window it ran, as single-stream's rate is
// read from its windows (quiver-train prints the ratio of the two): a kept single-stream is 1.00x
// itself, though the close call compared its latest windows only (it reported 128 of its 130).
TEST(LearnerTuner, TheKeptEntryCarriesItsFastestWindow) {
  LearnerTuner tuner(by_default(4));
  run(tuner, {130, 135, 133, 100, 140, 138, 128});
  ASSERT_TRUE(tuner.settled());
  const TunerStep& kept = tuner.history().back();
  double single = 0.0;
  for (const TunerStep& step : tuner.history())
    if (&step != &kept && step.learners == 1) single = std::max(single, step.samples_per_second);
  EXPECT_EQ(kept.learners, 1);
  EXPECT_DOUBLE_EQ(kept.samples_per_second, 130);
  EXPECT_DOUBLE_EQ(kept.samples_per_second / single, 1.0);
}

// Refused: the group stays in the configuration of the last window, and so does the tuner.
TEST(LearnerTuner, ARefusedWayBackKeepsWhereTheGroupIs) {
  // A close call (+12%), the candidate again, then the way back to 1 learner is refused: keep 2,
  // with the faster of its two windows.
  LearnerTuner close(on_cores(2, 4));
  EXPECT_EQ(run(close, {100, 112, 115}), (std::vector<int>{1, 2, 2}));
  EXPECT_EQ(close.current().learners, 1);
  close.refused();
  ASSERT_TRUE(close.settled());
  EXPECT_EQ(close.current().learners, 2);
  EXPECT_DOUBLE_EQ(close.history().back().samples_per_second, 115);
  // A clear loss settles on the best, and the way back to it is refused: keep the loser.
  LearnerTuner lost(on_cores(4, 4));
  EXPECT_EQ(run(lost, {100, 200, 150}), (std::vector<int>{1, 2, 3}));
  ASSERT_TRUE(lost.settled());
  EXPECT_EQ(lost.current().learners, 2);
  const size_t entries = lost.history().size();
  lost.refused();
  EXPECT_TRUE(lost.settled());
  EXPECT_EQ(lost.current().learners, 3);
  EXPECT_EQ(lost.history().size(), entries);  // the kept entry was replaced, not added
  EXPECT_DOUBLE_EQ(lost.history().back().samples_per_second, 150);
}

// After a close call promoted a candidate, the next close call compares with the best's latest
// window only, so the two configurations' windows straddle each other (B C C B).
TEST(LearnerTuner, TheNextCloseCallUsesTheBestsLatestWindow) {
  LearnerTuner tuner(on_cores(4, 4));
  // 2 learners win a close call (119, 112 against 100, 101); 3 learners are another close call
  // (130 / 119 = +9%), measured again (128), then 2 learners again (113): 130 against the faster
  // of 2 learners' latest window and this one, 113 x 1.1 = 124.3, so 3 learners win (against all
  // of 2 learners' windows, 119 x 1.1 = 130.9, they would not); 4 learners then lose.
  EXPECT_EQ(run(tuner, {100, 119, 112, 101, 130, 128, 113, 100}), (std::vector<int>{1, 2, 2, 1, 3, 3, 2, 4}));
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 3);
  EXPECT_DOUBLE_EQ(tuner.history().back().samples_per_second, 130);
}

// A window may end early only while a new configuration is explored and reads clearly below the
// best: not the first window (nothing to compare with), not a close call's second windows (those
// are measured in full), not above (1 - cut_below) x the best.
TEST(LearnerTuner, OnlyAClearLossOfANewConfigurationIsCutShort) {
  LearnerTuner tuner(on_cores(4, 4));
  EXPECT_FALSE(tuner.losing(1.0));  // the first configuration: single-stream itself
  EXPECT_THROW(tuner.measured_cut_short(1.0), Error);
  tuner.measured(100);  // 1 learner
  EXPECT_FALSE(tuner.losing(91));
  EXPECT_TRUE(tuner.losing(89));
  EXPECT_THROW(tuner.measured_cut_short(95), Error);  // not a clear loss
  tuner.measured(112);  // 2 learners: a close call, measured again
  EXPECT_FALSE(tuner.losing(10));
  tuner.measured(121);  // 2 learners again
  EXPECT_FALSE(tuner.losing(10));
  tuner.measured(102);  // 1 learner again: 116.5 against 101, 2 learners win; 3 learners next
  EXPECT_EQ(tuner.current().learners, 3);
  EXPECT_TRUE(tuner.losing(104));  // below 0.9 x 116.5
  tuner.measured_cut_short(80);
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 2);
  const std::vector<TunerStep>& history = tuner.history();
  ASSERT_EQ(history.size(), 6u);
  EXPECT_TRUE(history[4].cut_short);
  EXPECT_FALSE(history[3].cut_short);
  EXPECT_FALSE(history[5].cut_short);  // the kept configuration
  EXPECT_FALSE(tuner.losing(1.0));     // settled
  TunerOptions bad = on_cores(2, 4);
  bad.cut_below = 1.0;
  EXPECT_THROW(LearnerTuner{bad}, Error);
}

// A new configuration whose samples/s is bounded at or below the bar ((1 + threshold) x the best)
// is not run: it is recorded as bounded and the tuner keeps the best, as after a measured loss.
// A bound above the bar changes nothing (the caller measures); nor does any bound for the first
// configuration, during a close call's second windows, or once settled. A bound must be finite.
TEST(LearnerTuner, AConfigurationBoundedBelowTheBarIsNotRun) {
  LearnerTuner tuner(on_cores(4, 4));
  EXPECT_FALSE(tuner.bounded(1.0));  // the first configuration: nothing to compare with
  tuner.measured(100);               // 1 learner
  EXPECT_EQ(tuner.current().learners, 2);
  EXPECT_FALSE(tuner.bounded(140));  // could gain: measure it
  EXPECT_FALSE(tuner.settled());
  tuner.measured(150);  // 2 learners: +50%
  EXPECT_EQ(tuner.current().learners, 3);
  EXPECT_THROW(tuner.bounded(0.0), Error);
  EXPECT_THROW(tuner.bounded(std::numeric_limits<double>::infinity()), Error);
  EXPECT_TRUE(tuner.bounded(160));  // under 1.1 x 150: no gain above the threshold
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 2);
  const std::vector<TunerStep>& history = tuner.history();
  ASSERT_EQ(history.size(), 4u);  // 1, 2, 3 (bounded), the kept 2
  EXPECT_EQ(history[2].learners, 3);
  EXPECT_TRUE(history[2].bounded);
  EXPECT_DOUBLE_EQ(history[2].samples_per_second, 160);
  EXPECT_FALSE(history[1].bounded);
  EXPECT_FALSE(history[3].bounded);
  EXPECT_DOUBLE_EQ(history[3].samples_per_second, 150);
  EXPECT_FALSE(tuner.bounded(1.0));  // settled

  // A bound exactly at the bar is no gain above it (1.5 x 100: exact in binary).
  TunerOptions half = on_cores(2, 2);
  half.threshold = 0.5;
  LearnerTuner at_bar(half);
  at_bar.measured(100);
  EXPECT_FALSE(at_bar.bounded(150.5));
  EXPECT_TRUE(at_bar.bounded(150));

  // A close call's second windows are measured whatever a bound says.
  LearnerTuner close(on_cores(4, 4));
  close.measured(100);
  close.measured(112);  // 2 learners: a close call, measured again next
  EXPECT_FALSE(close.bounded(1.0));
  EXPECT_EQ(close.current().learners, 2);
  close.measured(114);  // ...then 1 learner again
  EXPECT_EQ(close.current().learners, 1);
  EXPECT_FALSE(close.bounded(1.0));
  close.measured(101);  // 113 against 100.5 x 1.1: 2 learners win; 3 next
  EXPECT_EQ(close.current().learners, 3);
  EXPECT_TRUE(close.bounded(120));
  EXPECT_EQ(close.current().learners, 2);
}

// A configuration refused after a bounded one (the kept one would not fit, say): the bounded
// entry stays in the history, and the tuner settles where the group last measured.
TEST(LearnerTuner, ARefusalAfterABoundKeepsTheBoundedEntry) {
  LearnerTuner tuner(on_cores(4, 4));
  tuner.measured(100);
  tuner.measured(150);  // 2 learners
  ASSERT_TRUE(tuner.bounded(120));  // 3 learners: not run; keep 2
  tuner.refused();
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(tuner.current().learners, 2);
  const std::vector<TunerStep>& history = tuner.history();
  ASSERT_EQ(history.size(), 4u);
  EXPECT_TRUE(history[2].bounded);
  EXPECT_EQ(history[3].learners, 2);
  EXPECT_FALSE(history[3].bounded);
}

// On GPUs the tuner adds one learner per device at a time, and threads do not shrink below one.
TEST(LearnerTuner, StepsByDevicesAndKeepsAThreadPerLearner) {
  TunerOptions devices = on_cores(1, 8);
  devices.step = 2;
  LearnerTuner tuner(devices);
  EXPECT_EQ(run(tuner, {100, 150, 100}), (std::vector<int>{2, 4, 6}));
  EXPECT_EQ(tuner.current().learners, 4);
  EXPECT_EQ(tuner.current().threads_per_learner, 1);
}

TEST(LearnerTuner, RejectsBadOptionsAndWindows) {
  TunerOptions bad = on_cores(0, 4);
  EXPECT_THROW(LearnerTuner{bad}, Error);
  bad = on_cores(2, 4);
  bad.step = 5;  // more than max learners
  EXPECT_THROW(LearnerTuner{bad}, Error);
  bad = on_cores(2, 4);
  bad.confirm_band = -0.1;
  EXPECT_THROW(LearnerTuner{bad}, Error);
  LearnerTuner tuner(on_cores(2, 4));
  EXPECT_THROW(tuner.measured(0.0), Error);
  EXPECT_THROW(tuner.measured(-5.0), Error);
  tuner.measured(100);
  tuner.measured(50);
  ASSERT_TRUE(tuner.settled());
  EXPECT_THROW(tuner.measured(100), Error);
}

}  // namespace
}  // namespace quiver
