#include "runtime/learner_tuner.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace quiver {

namespace {

// A configuration's samples/s from its windows: the fastest. Another tenant of a shared host only
// ever takes speed away, so the fastest window is the closest to what the configuration does; a
// mean let one window taken in a slow phase decide (two learners' 8720 and 8467 against one
// learner's 5363 and 8913 kept two learners on the mean, 8594 > 1.1 x 7138).
double fastest(const std::vector<double>& values) { return *std::max_element(values.begin(), values.end()); }

}  // namespace

LearnerTuner::LearnerTuner(TunerOptions options) : options_(options) {
  if (options.cores < 1 || options.step < 1 || options.max_learners < options.step)
    throw Error(cat("learner tuner: cores ", options.cores, ", step ", options.step, " and max learners ",
                    options.max_learners, " must be >= 1, with max learners >= step"));
  if (!(options.threshold >= 0.0) || !(options.confirm_band >= 0.0))
    throw Error(cat("learner tuner: threshold ", options.threshold, " and confirm band ", options.confirm_band,
                    " must be >= 0"));
  if (!(options.cut_below >= 0.0 && options.cut_below < 1.0))
    throw Error(cat("learner tuner: cut below ", options.cut_below, " must be in [0, 1)"));
  current_ = {options.step, options.cores, 0.0};
}

bool LearnerTuner::losing(double samples_per_second) const {
  return !settled_ && phase_ == Phase::Explore && best_.learners > 0 &&
         samples_per_second < (1.0 - options_.cut_below) * best_.samples_per_second;
}

void LearnerTuner::measured(double samples_per_second) { record(samples_per_second, false); }

void LearnerTuner::measured_cut_short(double samples_per_second) {
  if (!settled_ && !losing(samples_per_second))
    throw Error(cat("learner tuner: a window of ", samples_per_second, " samples/s cut short, but it is not a clear loss"));
  record(samples_per_second, true);
}

bool LearnerTuner::bounded(double samples_per_second) {
  if (!(samples_per_second > 0.0) || !std::isfinite(samples_per_second))
    throw Error(cat("learner tuner: a bound of ", samples_per_second, " samples/s"));
  if (settled_ || phase_ != Phase::Explore || best_.learners == 0 ||
      samples_per_second > (1.0 + options_.threshold) * best_.samples_per_second)
    return false;
  TunerStep skipped = current_;
  skipped.samples_per_second = samples_per_second;
  skipped.bounded = true;
  history_.push_back(skipped);  // last_ stays: the group never ran this configuration
  leap_or_settle(skipped.learners);  // as a measured loss: a leap next, or settled (a leap's bound)
  return true;
}

void LearnerTuner::record(double samples_per_second, bool cut_short) {
  if (settled_) throw Error("learner tuner: measured() after it settled");
  if (!(samples_per_second > 0.0) || !std::isfinite(samples_per_second))
    throw Error(cat("learner tuner: a window of ", samples_per_second, " samples/s"));
  TunerStep window = current_;
  window.samples_per_second = samples_per_second;
  window.again = phase_ != Phase::Explore;
  window.cut_short = cut_short;
  history_.push_back(window);
  last_ = window;
  const double bar = 1.0 + options_.threshold;
  switch (phase_) {
    case Phase::Explore: {
      if (best_.learners == 0) {  // the first configuration: single-stream
        best_ = window, best_rates_ = {samples_per_second};
        return grow_from(best_);
      }
      const double gain = samples_per_second / best_.samples_per_second;
      const bool close = std::abs(gain - bar) <= options_.confirm_band || (options_.confirm_gains && gain > bar);
      if (close) {  // a close call (or any gain, confirm_gains): the candidate again
        candidate_ = window, candidate_rates_ = {samples_per_second};
        // The best's latest window only, so its two sides straddle the candidate's (A B B A).
        best_rates_ = {best_rates_.back()};
        phase_ = Phase::CandidateAgain;
        return;
      }
      if (gain > bar) {
        best_ = window, best_rates_ = {samples_per_second};
        return grow_from(best_);
      }
      return leap_or_settle(window.learners);
    }
    case Phase::CandidateAgain:  // then the best so far again
      candidate_rates_.push_back(samples_per_second);
      phase_ = Phase::BestAgain;
      current_ = {best_.learners, best_.threads_per_learner, 0.0};
      return;
    case Phase::BestAgain: {
      best_rates_.push_back(samples_per_second);
      phase_ = Phase::Explore;
      const double candidate = fastest(candidate_rates_), best = fastest(best_rates_);
      if (candidate > best * bar) {
        best_ = candidate_, best_.samples_per_second = candidate, best_rates_ = candidate_rates_;
        return grow_from(best_);
      }
      best_.samples_per_second = best;
      return leap_or_settle(candidate_.learners);
    }
  }
}

void LearnerTuner::refused() {
  if (history_.empty()) throw Error("learner tuner: refused() before any window");
  auto same = [](const TunerStep& a, const TunerStep& b) {
    return a.learners == b.learners && a.threads_per_learner == b.threads_per_learner;
  };
  // A new configuration (growth or a leap) could not be built: keep the best so far, which the
  // caller returns to. The group may not be there: after a confirmed gain it ran the old best's
  // second window (A B B A), and the winner B is the best.
  if (phase_ == Phase::Explore && !settled_) {
    leaping_ = false;
    return settle();
  }
  if (settled_) history_.pop_back(), settled_ = false;  // the kept entry changes
  TunerStep stay = last_;
  if (same(stay, best_))
    stay = best_;
  else if (same(stay, candidate_) && !candidate_rates_.empty())
    stay.samples_per_second = fastest(candidate_rates_);
  best_ = stay;
  settle();
}

void LearnerTuner::grow_from(const TunerStep& from) {
  leaping_ = false;
  const int next = from.learners + options_.step;
  if (next > options_.max_learners) return settle();
  current_ = {next, std::max(1, options_.cores / next), 0.0};
}

void LearnerTuner::leap_or_settle(int failed_learners) {
  int leap = std::min(options_.max_learners, 2 * failed_learners);
  leap -= leap % options_.step;  // whole learners per device
  if (!options_.leap || leaping_ || leap <= failed_learners) {  // a failed leap settles
    leaping_ = false;
    return settle();
  }
  leaping_ = true;
  current_ = {leap, std::max(1, options_.cores / leap), 0.0};
  current_.leap = true;
}

void LearnerTuner::settle() {
  settled_ = true;
  phase_ = Phase::Explore;
  current_ = {best_.learners, best_.threads_per_learner, 0.0};
  TunerStep kept = best_;
  // Reported with the fastest window this configuration ran (comparisons may have used its latest
  // ones only), as single-stream's rate is read from its windows: a kept single-stream is 1.00x it.
  for (const TunerStep& window : history_)
    if (!window.bounded && window.learners == kept.learners && window.threads_per_learner == kept.threads_per_learner)
      kept.samples_per_second = std::max(kept.samples_per_second, window.samples_per_second);
  kept.again = false;
  kept.cut_short = false;
  kept.bounded = false;
  kept.leap = false;
  history_.push_back(kept);
}

}  // namespace quiver
