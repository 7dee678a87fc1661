// The learner-count tuner of LearnerGroup::fit (Crossbow's rule): measure samples/s of one
// configuration at a time, starting from one learner (per device) on all cores; add a learner
// (the cores split evenly) while samples/s rises by more than a threshold; then keep the best.
//
// A close call is measured twice. On a shared machine one window's samples/s is noisy by several
// percent, as much as the threshold itself, so a gain within `confirm_band` of the threshold is
// not trusted on one window: the candidate is measured again at once, then the best so far again
// (A B B A: a host whose speed drifts steadily favours neither), and each one's faster window
// decides (another tenant only takes speed away; a mean let one slow window decide). With
// `confirm_gains` (the default) every gain above the threshold is confirmed so too, however large:
// a window of the best taken while the host was slow makes any next configuration look far
// better (measured here: one learner's window at 5665 samples/s, two learners' at 7522, +33%,
// kept on one window; single-stream again would have read about 7700), and a configuration kept
// by mistake costs every later round, while confirming a true gain costs two windows. A gain
// clearly below the threshold costs nothing extra.
//
// A clear loss is cut short. Each window of a configuration that loses costs training time at
// its lower rate (and more learners under SMA gain less per sample), so once the first part of a
// new configuration's window is already well below the best (`losing()`), the caller may end the
// window there: no plausible rest of the window could lift it to a gain worth a learner.
//
// A configuration known to lose is not run. Where the caller can bound a new configuration's
// samples/s from above before running it (LearnerGroup: one-thread learners, from the serial step
// its executor measured), a bound no higher than the threshold's bar counts as a loss would (a
// leap next, below, or settled), without a window whose training pays for the slower configuration.
//
// A plateau is leapt over once. On many cores (or a GPU) one more learner can gain nothing while
// many more gain a lot: on a 16-core host the MLP at batch 16 read 0.97x single-stream with 2
// learners of 8 threads, 1.22x with 4 of 4, 2.76x with 16 of 1. So when the next learner count
// fails to gain, the tuner tries twice that count (at most max_learners) before it settles; a gain
// there becomes the best and growth goes on by one from it, a failed leap settles. Where twice the
// failed count is no new configuration (2 cores: 2 learners are the most), nothing changes.
//
// The tuner only decides; LearnerGroup::fit trains, measures the windows and resizes the group.
#pragma once

#include <vector>

namespace quiver {

// One configuration the tuner measured (one window), or, as the last entry of a settled
// history, the configuration it kept with the samples/s of its fastest window (of all it ran).
struct TunerStep {
  int learners = 0, threads_per_learner = 0;
  double samples_per_second = 0.0;
  bool again = false;  // a close call's second window of this configuration
  bool cut_short = false;  // the window ended early: clearly slower than the best (losing())
  // Not run: samples_per_second is an upper bound the caller knew beforehand, no gain worth a
  // learner (bounded()).
  bool bounded = false;
  bool leap = false;  // a leap over a plateau: twice the learner count that failed to gain
};

struct TunerOptions {
  int cores = 1;          // CPU: split among the learners (one thread each at least)
  int step = 1;           // learners added at a time (one per device)
  int max_learners = 1;   // never more
  double threshold = 0.10;     // add a learner while samples/s rises by more than this
  double confirm_band = 0.10;  // a gain within this of the threshold is measured twice
  bool confirm_gains = true;   // ...and so is every gain above the threshold (false: on one window)
  // losing(): a new configuration whose partial window reads below (1 - cut_below) x the best.
  double cut_below = 0.10;
  bool leap = true;  // leap over a plateau once (twice the failed learner count) before settling
};

class LearnerTuner {
 public:
  explicit LearnerTuner(TunerOptions options);  // throws quiver::Error on bad options

  // The configuration to measure now (learners, threads_per_learner; its samples/s unused).
  const TunerStep& current() const { return current_; }
  // Records one window of current() at `samples_per_second`; current() is then the next
  // configuration to measure (the same one for a close call's second window), or, once
  // settled(), the one to keep.
  void measured(double samples_per_second);
  // True when the window under way may end now as a clear loss: it explores a new configuration
  // (not the first, not a close call's second window) and reads, so far, `samples_per_second`
  // below (1 - cut_below) of the best. The caller then passes that rate to measured_cut_short().
  bool losing(double samples_per_second) const;
  // measured() for a window ended early because losing() said so (recorded as cut short).
  void measured_cut_short(double samples_per_second);
  // current(), a new configuration being explored, can reach at most `samples_per_second`. When
  // that is no more than (1 + threshold) x the best, it cannot be a gain worth a learner: it is
  // recorded (marked bounded, with the bound as its samples/s), the tuner goes on as after a
  // measured loss (current() is then the leap, which the caller may bound in turn, or the tuner
  // has settled), and this returns true. Otherwise (or while a close call is being measured, or
  // for the first configuration) nothing changes, it returns false, and the caller measures.
  bool bounded(double samples_per_second);
  // The configuration current() asked for could not be built (it would not fit in memory). A
  // refused new configuration (growth, or a leap) settles at the best so far, so current() may
  // then differ from the group's configuration (after a confirmed gain the group ran the old
  // best's second window): the caller returns to it, and if that is refused too, calls refused()
  // again. A refused way back during a close call (or to the kept configuration) settles where the
  // group is, with the fastest of that configuration's windows in the comparison under way.
  void refused();
  bool settled() const { return settled_; }
  // Every window, in order, then (once settled) the kept configuration.
  const std::vector<TunerStep>& history() const { return history_; }

 private:
  void record(double samples_per_second, bool cut_short);
  void grow_from(const TunerStep& from);
  // After a configuration failed to gain over the best: a leap to twice its learner count, or settle().
  void leap_or_settle(int failed_learners);
  void settle();

  TunerOptions options_;
  TunerStep current_, best_, last_;  // last_: the configuration of the latest window
  enum class Phase { Explore, CandidateAgain, BestAgain } phase_ = Phase::Explore;
  std::vector<double> best_rates_, candidate_rates_;  // the windows behind best_ and a close candidate
  TunerStep candidate_;
  bool settled_ = false;
  bool leaping_ = false;  // current_ (or the close call under way) is a leap
  std::vector<TunerStep> history_;
};

}  // namespace quiver
