#include "runtime/executor.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "runtime/thread_budget.h"

namespace quiver {

Policy parse_policy(const std::string& name) {
  if (name == "serial") return Policy::Serial;
  if (name == "intra") return Policy::Intra;
  if (name == "fixed") return Policy::Fixed;
  if (name == "auto") return Policy::Auto;
  throw Error(cat("unknown execution policy '", name, "' (choose serial, intra, fixed or auto)"));
}

const char* name_of(Policy policy) {
  switch (policy) {
    case Policy::Serial: return "serial";
    case Policy::Intra: return "intra";
    case Policy::Fixed: return "fixed";
    case Policy::Auto: return "auto";
  }
  return "?";
}

namespace {

// The performance model's threads: the executor's under auto, one otherwise. A count beyond what
// the model describes (and a TBB arena would be asked for) is refused first, naming the executor.
int model_threads(const ExecutorOptions& options) {
  if ((options.policy == Policy::Auto || options.policy == Policy::Intra) && options.threads > PerfModel::kMostThreads)
    throw Error(cat("executor: policy ", name_of(options.policy), ": ", options.threads, " threads is more than ",
                    PerfModel::kMostThreads));
  return std::max(1, options.policy == Policy::Auto ? options.threads : 1);
}

}  // namespace

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMeasurementsKept = 32;
constexpr size_t kCandidates = 4;  // auto's candidate schedules: model, intra, narrow, serial
constexpr int kIntraSchedule = 1;   // the baseline another schedule must beat
constexpr int kSerialSchedule = 3;  // the one of width 1
constexpr size_t kTrialBlocks = 3;  // a trial: at most 3 blocks, until two agree

// Rows of cells as text columns, each as wide as its widest cell and at least `widths` (a long
// node name widens its column rather than pushing its row out of line); the first `left` columns
// are aligned left, the others right.
std::string aligned_table(const std::vector<std::vector<std::string>>& rows, std::vector<size_t> widths, size_t left) {
  for (const std::vector<std::string>& row : rows)
    for (size_t c = 0; c < row.size() && c < widths.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  std::string text;
  for (const std::vector<std::string>& row : rows) {
    for (size_t c = 0; c < row.size() && c < widths.size(); ++c) {
      const std::string padding(widths[c] - row[c].size(), ' ');
      if (c > 0) text += ' ';
      text += c < left ? row[c] + padding : padding + row[c];
    }
    text += '\n';
  }
  return text;
}

}  // namespace

struct Executor::State {
  struct Lane {
    std::map<int, std::unique_ptr<ThreadBudget>> budgets;  // by size, made on first use
    std::thread thread;                                    // none for lane 0 (run()'s caller)
    std::condition_variable wake;                          // an assignment, the end of the run, or stop
    int assigned = -1;  // step position to run, -1 when idle
    int threads = 1;    // its grant
    // Whether the op was alone when it started, and the run's launch count then: it ran alone
    // throughout if nothing else was launched before it finished.
    bool alone = false;
    int64_t launch_number = 0;
  };
  std::mutex mutex;
  std::vector<std::unique_ptr<Lane>> lanes;
  bool stopping = false;
  // The run in progress.
  int64_t run_index = 0;
  std::vector<int> waiting;  // unfinished predecessors per position
  std::vector<int> ready;
  std::vector<Running> running;
  int free_threads = 0, finished = 0;
  int64_t launches = 0;  // ops launched in this run so far
  bool profiling = false;
  int profile_threads = 0;  // threads of this profiling run; 0 for a warm-up run
  Clock::time_point start;
  std::exception_ptr first_error;
  // dispatch()'s launches and choose_auto()'s running ops by finish time. With `ready` and
  // `running`, reserved for every op when the executor is made: the bookkeeping a lane does
  // after a kernel allocates nothing, so nothing can throw on a lane's thread (an exception
  // there would end the process) or leave run() while other lanes still run.
  std::vector<Running> chosen, by_finish;
  bool done() const { return finished == static_cast<int>(waiting.size()) || (first_error && running.empty()); }
};

Executor::Executor(Plan& plan, ExecutorOptions options)
    : plan_(plan), options_(options), model_(model_threads(options)),
      state_(std::make_unique<State>()) {
  // A device plan queues its kernels in order on its stream: there are no threads to grant.
  if (!plan_.device().is_cpu())
    throw Error(cat("executor: the plan runs on ", plan_.device().str(),
                    "; the executor schedules CPU plans (run a device plan with Plan::run)"));
  // The one schedule of a fixed policy is named after it (auto names its candidates once profiled).
  if (options_.policy != Policy::Auto) candidate_names_ = {name_of(options_.policy)};
  int lane_count = 1;
  switch (options_.policy) {
    case Policy::Serial: capacity_ = 1; break;
    case Policy::Intra: capacity_ = options_.threads; break;
    case Policy::Fixed:
      lane_count = options_.inter;
      if (__builtin_mul_overflow(options_.inter, options_.intra, &capacity_) || capacity_ > PerfModel::kMostThreads)
        throw Error(cat("executor: policy fixed: inter ", options_.inter, " x intra ", options_.intra,
                        " threads is more than ", PerfModel::kMostThreads));
      break;
    case Policy::Auto: lane_count = options_.threads, capacity_ = options_.threads; break;
  }
  if (lane_count < 1 || capacity_ < 1 || (options_.policy == Policy::Fixed && options_.intra < 1))
    throw Error(cat("executor: policy ", name_of(options_.policy), " needs at least one thread, got threads=",
                    options_.threads, " inter=", options_.inter, " intra=", options_.intra));
  // Each running op's lane thread takes one of its granted threads and TBB's workers the rest:
  // under fixed every lane may run an op of intra threads at once; otherwise one op may hold them
  // all. Above the cores (a --threads or inter x intra the user asked for) they take turns, but
  // they exist: without the allowance an op would run on fewer threads than it was granted.
  allowance_ = std::make_unique<ThreadAllowance>(options_.policy == Policy::Fixed ? capacity_ - lane_count + 1 : capacity_);
  if (options_.profile_samples < 1 || options_.profile_warmup < 0)
    throw Error(cat("executor: profile_samples must be >= 1 and profile_warmup >= 0, got ", options_.profile_samples,
                    " and ", options_.profile_warmup));
  if (!(options_.grant_tolerance >= 0.0))
    throw Error(cat("executor: grant_tolerance must be >= 0, got ", options_.grant_tolerance));
  if (!(options_.grant_slack_s >= 0.0 && std::isfinite(options_.grant_slack_s)))
    throw Error(cat("executor: grant_slack_s must be finite and >= 0, got ", options_.grant_slack_s));
  // Step counts the tuning adds up (tuning_runs_left) in an int.
  constexpr int kMostTuningSteps = 1 << 20;
  for (const auto& [name, count] : {std::pair{"profile_samples", options_.profile_samples},
                                    std::pair{"profile_warmup", options_.profile_warmup},
                                    std::pair{"trial_rounds", options_.trial_rounds},
                                    std::pair{"trial_stint", options_.trial_stint}})
    if (count > kMostTuningSteps)
      throw Error(cat("executor: ", name, " must be at most ", kMostTuningSteps, ", got ", count));
  // A trial that can never last long enough would cycle through the candidates (serial among
  // them) for good; NaN would also turn retrials off without a word.
  for (const auto& [name, seconds] : {std::pair{"trial_seconds", options_.trial_seconds},
                                      std::pair{"retrial_seconds", options_.retrial_seconds}})
    if (!(seconds >= 0.0 && std::isfinite(seconds)))
      throw Error(cat("executor: ", name, " must be finite and >= 0, got ", seconds));
  if (options_.trial_rounds < 1 || options_.trial_stint < 1)
    throw Error(cat("executor: trial_rounds and trial_stint must be >= 1, got ", options_.trial_rounds, " and ",
                    options_.trial_stint));

  // Dependencies between step positions: data (producer of an input), control, buffer reuse.
  const Graph& graph = plan_.graph();
  const std::vector<PlanStep>& steps = plan_.steps();
  const int count = static_cast<int>(steps.size());
  std::map<NodeId, int> position_of;
  for (int p = 0; p < count; ++p) position_of[steps[p].node] = p;
  successors_.assign(count, {});
  predecessor_count_.assign(count, 0);
  for (int p = 0; p < count; ++p) {
    std::vector<int> before = steps[p].after;
    const Node& node = graph.node(steps[p].node);
    for (ValueId input : node.inputs) {
      auto found = position_of.find(graph.value(input).producer);
      if (found != position_of.end()) before.push_back(found->second);
    }
    for (NodeId control : node.control_inputs) {
      auto found = position_of.find(control);
      if (found != position_of.end()) before.push_back(found->second);
    }
    std::sort(before.begin(), before.end());
    before.erase(std::unique(before.begin(), before.end()), before.end());
    for (int q : before) successors_[q].push_back(p);
    predecessor_count_[p] = static_cast<int>(before.size());
    keys_.push_back(op_key(graph, node, steps[p].kernel_name));
  }
  const int fixed_grant = options_.policy == Policy::Fixed ? options_.intra : capacity_;
  grants_.assign(count, options_.policy == Policy::Auto ? 1 : fixed_grant);
  last_threads_.assign(count, 0);
  threads_used_.assign(count, 0);
  measured_.assign(count, std::vector<std::vector<double>>(capacity_ + 1));
  measured_alone_ = measured_;
  if (options_.refresh_steps < 0 || !(options_.refresh_tolerance >= 0.0))
    throw Error(cat("executor: refresh_steps must be >= 0 and refresh_tolerance >= 0, got ", options_.refresh_steps,
                    " and ", options_.refresh_tolerance));
  // Bottom levels before any profile: profiled plan times when there are some, one unit per op
  // otherwise. auto replaces them with the model's predictions.
  bottom_levels_.assign(count, 0.0);
  for (int p = count - 1; p >= 0; --p) {
    double tail = 0.0;
    for (int s : successors_[p]) tail = std::max(tail, bottom_levels_[s]);
    bottom_levels_[p] = std::max(steps[p].seconds, 1e-6) + tail;
  }

  if (options_.policy == Policy::Auto) {
    if (!options_.profile_cache.empty() && model_.load(options_.profile_cache)) {
      bool complete = true;
      for (const std::string& key : keys_) complete = complete && model_.complete(key, 1);
      if (complete) {
        loaded_from_cache_ = true;
        finish_profiling();
      } else {
        // Profiled afresh, from fresh samples only: the cached medians would have joined them as
        // samples (a third of each median at profile_samples 2) and been saved as this run's.
        // The cache's other entries stay in the file (save() merges).
        model_ = PerfModel(model_.max_threads());
      }
    }
    if (!profiled_) {
      profile_schedule_.assign(options_.profile_warmup, 0);
      for (int threads : model_.profiled_counts())
        for (int sample = 0; sample < options_.profile_samples; ++sample) profile_schedule_.push_back(threads);
    }
  }

  for (std::vector<Running>* ops : {&state_->running, &state_->chosen, &state_->by_finish})
    ops->reserve(static_cast<size_t>(count));
  state_->ready.reserve(static_cast<size_t>(count));
  for (int l = 0; l < lane_count; ++l) state_->lanes.push_back(std::make_unique<State::Lane>());
  for (int l = 1; l < lane_count; ++l) {
    try {
      state_->lanes[l]->thread = std::thread([this, l] { lane_main(l); });
    } catch (const std::system_error& error) {  // no destructor runs for a half-made executor
      stop_lanes();
      throw Error(cat("executor: cannot start lane thread ", l, " of ", lane_count - 1, ": ", error.what()));
    }
  }
}

void Executor::stop_lanes() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  for (auto& lane : state_->lanes) lane->wake.notify_all();
  for (auto& lane : state_->lanes)
    if (lane->thread.joinable()) lane->thread.join();
}

Executor::~Executor() {
  // save_profiles() warns rather than throws; out of memory, even its warning's text can fail.
  if (profiles_unsaved_) try {
      save_profiles();
    } catch (...) {
    }
  stop_lanes();
}

int Executor::lanes() const { return static_cast<int>(state_->lanes.size()); }

size_t Executor::trial_stint() const { return static_cast<size_t>(std::max(1, options_.trial_stint)); }

size_t Executor::trial_candidate() const { return trial_run_ / trial_stint() % kCandidates; }

size_t Executor::trial_steps_per_block() const {
  const size_t stint = trial_stint(), timed = stint == 1 ? 1 : stint - 1;
  const size_t stints = (static_cast<size_t>(std::max(1, options_.trial_rounds)) + timed - 1) / timed;
  return kCandidates * stint * stints;
}

int Executor::tuning_runs_left() const {
  if (options_.policy != Policy::Auto || tuned_) return 0;
  const size_t profiling = profile_schedule_.size() - std::min(profile_run_, profile_schedule_.size());
  if (capacity_ == 1) return static_cast<int>(profiling);
  const size_t trials = trial_steps_per_block(), cycle = kCandidates * trial_stint();
  const size_t trials_left = std::max(trials - std::min(trial_run_, trials), cycle - trial_run_ % cycle);
  const size_t blocks_after = verdicts_.empty() ? 1 : 0;  // at least two blocks of trial steps
  return static_cast<int>(profiling + trials_left + blocks_after * trials);
}

void Executor::use_grants(const std::vector<int>& grants) {
  grants_ = grants;
  for (int p = static_cast<int>(keys_.size()) - 1; p >= 0; --p) {
    double tail = 0.0;
    for (int s : successors_[p]) tail = std::max(tail, bottom_levels_[s]);
    bottom_levels_[p] = model_.predict(keys_[p], grants_[p]) + tail;
  }
}

void Executor::start_trial_block() {
  trial_run_ = 0;
  trial_time_ = 0.0;
  for (std::vector<double>& times : trial_seconds_) times.clear();
}

void Executor::use_schedule(int candidate) {
  use_grants(candidate_grants_[candidate]);
  width_ = candidate_widths_[candidate];
  widen_alone_ = candidate_names_.at(candidate) != "narrow";
}

std::vector<int> Executor::model_grants() const {
  std::vector<int> grants(keys_.size());
  for (size_t p = 0; p < keys_.size(); ++p)
    grants[p] = model_.grant(keys_[p], options_.grant_tolerance, options_.grant_slack_s);
  return grants;
}

void Executor::refit() {
  model_.fit();
  predicted_.assign(keys_.size(), std::vector<double>(static_cast<size_t>(capacity_) + 1, 0.0));
  fastest_.assign(keys_.size(), 1);
  for (size_t p = 0; p < keys_.size(); ++p) {
    for (int threads = 1; threads <= capacity_; ++threads) predicted_[p][threads] = model_.predict(keys_[p], threads);
    fastest_[p] = model_.fastest(keys_[p]);
  }
}

void Executor::finish_profiling() {
  refit();
  const int count = static_cast<int>(keys_.size());
  candidate_grants_ = {model_grants()};
  candidate_widths_ = {capacity_};
  if (capacity_ > 1) {
    // The model's grants; intra (every op on all threads); narrow (one thread per op, ops side by
    // side); serial (one thread, one op at a time: where splitting small ops costs more than it
    // saves and co-running ops fight over memory bandwidth, it beats the others).
    candidate_names_ = {"model", "intra", "narrow", "serial"};
    candidate_grants_.push_back(std::vector<int>(count, capacity_));
    candidate_grants_.push_back(std::vector<int>(count, 1));
    candidate_grants_.push_back(std::vector<int>(count, 1));
    candidate_widths_ = {capacity_, capacity_, capacity_, 1};
    trial_seconds_.assign(candidate_grants_.size(), {});
  } else {
    tuned_ = true;
  }
  use_schedule(0);
  profiled_ = true;
  if (!loaded_from_cache_ && !adopted_) save_profiles();
}

std::optional<ExecutorTuning> Executor::tuning() const {
  if (options_.policy != Policy::Auto || !profiled_) return std::nullopt;
  ExecutorTuning tuning;
  tuning.keys = keys_;
  tuning.threads = capacity_;
  tuning.model = model_;
  tuning.trials_done = trials_done_;
  if (trials_done_ > 0) {
    tuning.schedule = chosen_;
    tuning.grants = chosen_grants_;
    tuning.settled_seconds = settled_seconds_;  // during a retrial: at or past the period, so due
    tuning.trial_seconds = chosen_trial_seconds_;
    tuning.verdicts = chosen_verdicts_;
  }
  return tuning;
}

bool Executor::adopt(const ExecutorTuning& tuning) {
  if (options_.policy != Policy::Auto || started_ || tuning.threads != capacity_ || tuning.keys != keys_ ||
      tuning.model.max_threads() != model_.max_threads())
    return false;
  // Everything is checked before anything changes: a profile missing for an op (or for one of the
  // counts profiling would time) would fail the refit below halfway, or never be profiled.
  for (const std::string& key : keys_)
    if (!tuning.model.complete(key, 1)) return false;
  if (tuning.trials_done > 0 && capacity_ > 1) {  // a choice: it must be one this executor can make
    auto in = [](int value, int low, int high) { return value >= low && value <= high; };
    bool sound = in(tuning.schedule, 0, static_cast<int>(kCandidates) - 1) && tuning.trial_seconds.size() == kCandidates &&
                 tuning.grants.size() == keys_.size() && !tuning.verdicts.empty() &&
                 std::isfinite(tuning.settled_seconds) && tuning.settled_seconds >= 0.0;  // NaN: no retrial ever
    for (const std::vector<double>& seconds : tuning.trial_seconds) {
      sound = sound && !seconds.empty();
      for (double time : seconds) sound = sound && std::isfinite(time) && time >= 0.0;
    }
    for (int verdict : tuning.verdicts) sound = sound && in(verdict, 0, static_cast<int>(kCandidates) - 1);
    // Within the chosen schedule's width (serial's is 1): a wider grant could never start, and
    // every step would end as "a dependency cycle". The plain schedules' grants are theirs alone
    // (intra: all threads; narrow and serial: one), only the model's vary.
    const int widest = tuning.schedule == kSerialSchedule ? 1 : capacity_;
    for (int grant : tuning.grants) {
      sound = sound && in(grant, 1, widest);
      if (tuning.schedule != 0) sound = sound && grant == (tuning.schedule == kIntraSchedule ? capacity_ : 1);
    }
    if (!sound) return false;
  }
  model_ = tuning.model;
  adopted_ = true;
  adopted_schedule_ = false;
  loaded_from_cache_ = false;
  profile_schedule_.clear();
  profile_run_ = 0;
  // Whatever a cache (or an earlier adopt) had set up: from these profiles, as if just profiled.
  tuned_ = false;
  chosen_ = 0;
  trials_done_ = 0;
  settled_seconds_ = 0.0;
  chosen_grants_.clear();
  chosen_trial_seconds_.clear();
  chosen_verdicts_.clear();
  verdicts_.clear();
  finish_profiling();
  start_trial_block();
  if (capacity_ > 1 && tuning.trials_done > 0) {
    // The choice as its trial ran it: the chosen candidate's grants then, which for the model's
    // schedule may differ from what the model (refreshed since) would grant now.
    chosen_ = tuning.schedule;
    use_grants(tuning.grants);
    width_ = candidate_widths_[chosen_];
    widen_alone_ = candidate_names_.at(chosen_) != "narrow";
    chosen_grants_ = tuning.grants;
    tuned_ = true;
    trials_done_ = tuning.trials_done;
    settled_seconds_ = tuning.settled_seconds;
    chosen_trial_seconds_ = tuning.trial_seconds;
    chosen_verdicts_ = tuning.verdicts;
    adopted_schedule_ = true;
  }
  return true;
}

void Executor::save_profiles() {
  profiles_unsaved_ = false;
  if (options_.profile_cache.empty() || !options_.save_profiles || cache_failed_) return;
  try {
    model_.save(options_.profile_cache);
  } catch (const std::exception& error) {
    // Not tried again: a save after every retrial would wait out a held lock (or repeat the
    // warning) every few seconds of training.
    cache_failed_ = true;
    warn(cat("profiles not cached: ", error.what(), "; this executor saves them no more"));
  }
}

void Executor::refresh_model() {
  constexpr size_t kEnough = 5;  // timings of a key at a thread count before they can overrule the model
  std::map<std::string, std::map<int, std::vector<double>>> alone;  // equal ops pool their timings
  for (size_t p = 0; p < keys_.size(); ++p)
    for (int threads = 1; threads < static_cast<int>(measured_alone_[p].size()); ++threads) {
      const std::vector<double>& times = measured_alone_[p][threads];
      if (times.empty()) continue;
      std::vector<double>& pooled = alone[keys_[p]][threads];
      pooled.insert(pooled.end(), times.begin(), times.end());
    }
  struct Replacement {
    const std::string* key;
    int threads;
    std::vector<double>* times;
  };
  std::vector<Replacement> replacements;  // decided on the current fit first: a replaced key is unfitted
  for (auto& [key, by_threads] : alone)
    for (auto& [threads, times] : by_threads) {
      if (times.size() < kEnough) continue;
      const double measured = median_of(times);
      if (std::abs(model_.predict(key, threads) - measured) > options_.refresh_tolerance * measured)
        replacements.push_back({&key, threads, &times});
    }
  if (replacements.empty()) return;
  for (const Replacement& r : replacements) {
    model_.replace_samples(*r.key, r.threads, std::move(*r.times));
    // In the model now: the next refresh weighs it against timings taken after it, not these
    // again (a fit that cannot pass through them would be "refreshed" with them every time).
    for (size_t p = 0; p < keys_.size(); ++p)
      if (keys_[p] == *r.key && r.threads < static_cast<int>(measured_alone_[p].size()))
        measured_alone_[p][r.threads].clear();
  }
  const int replaced = static_cast<int>(replacements.size());
  refit();
  candidate_grants_[0] = model_grants();  // the model's schedule from the next trial on
  use_grants(std::vector<int>(grants_));  // the schedule in use keeps its grants; bottom levels refreshed
  ++model_refreshes_;
  refreshed_pairs_ += replaced;
  profiles_unsaved_ = true;  // written at the next trial or when the executor goes: a write is
                             // milliseconds, a step can be a tenth of one
}

void Executor::choose_auto(std::vector<int>& ready, int& free_threads, double now, std::vector<Running>& running,
                           std::vector<Running>& launches) const {
  auto launch = [&](size_t index, int threads) {
    const int position = ready[index];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(index));
    Running started{position, threads, now + predicted_[position][threads]};
    running.push_back(started);
    launches.push_back(started);
    free_threads -= threads;
  };
  while (free_threads > 0 && !ready.empty()) {
    const int top = ready.front();
    const std::vector<double>& predicted = predicted_[top];
    const int want = grants_[top];
    if (free_threads >= want) {
      // Alone in the queue, an op may take the threads that still speed it up (not under narrow).
      const int threads = widen_alone_ && ready.size() == 1 ? std::clamp(fastest_[top], want, free_threads) : want;
      launch(0, threads);
      continue;
    }
    // Too few threads free: when will `want` be, and does starting now on fewer finish sooner?
    std::vector<Running>& by_finish = state_->by_finish;
    by_finish.assign(running.begin(), running.end());
    std::sort(by_finish.begin(), by_finish.end(),
              [](const Running& a, const Running& b) { return a.predicted_finish < b.predicted_finish; });
    double available_at = now;
    int free_then = free_threads;
    for (const Running& r : by_finish) {
      if (free_then >= want) break;
      free_then += r.threads;
      available_at = std::max(now, r.predicted_finish);
    }
    if (now + predicted[free_threads] <= available_at + predicted[want]) {
      launch(0, free_threads);
      continue;
    }
    // Backfill: later ops that finish before the top op could start do not delay it.
    for (size_t i = 1; i < ready.size() && free_threads > 0;) {
      const int threads = std::min(grants_[ready[i]], free_threads);
      if (now + predicted_[ready[i]][threads] <= available_at)
        launch(i, threads);
      else
        ++i;
    }
    break;
  }
}

void Executor::lane_main(int lane) {
  State& state = *state_;
  std::unique_lock<std::mutex> lock(state.mutex);
  for (;;) {
    state.lanes[lane]->wake.wait(lock, [&] { return state.stopping || state.lanes[lane]->assigned >= 0; });
    if (state.stopping) return;
    run_assigned(lane, lock);
  }
}

void Executor::run_assigned(int lane_index, std::unique_lock<std::mutex>& lock) {
  State& state = *state_;
  State::Lane& lane = *state.lanes[lane_index];
  const int position = lane.assigned, threads = lane.threads;
  const int64_t run_index = state.run_index;
  lock.unlock();
  double seconds = 0.0;
  std::exception_ptr error;
  try {  // everything that can throw on this lane's thread, the budget's creation included
    std::unique_ptr<ThreadBudget>& budget = lane.budgets[threads];  // this lane's own: no lock needed
    if (!budget) {
      try {
        budget = std::make_unique<ThreadBudget>(threads);
      } catch (...) {  // a thread that cannot start (the own pool's builds): named as a kernel's error is
        rethrow_naming(plan_.graph().node(plan_.steps()[static_cast<size_t>(position)].node));
      }
    }
    if (options_.record_threads) budget->record_threads(true);
    const Clock::time_point start = Clock::now();
    plan_.run_step(position, *budget, run_index);
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (options_.record_threads) {
      threads_used_[position] = static_cast<int>(budget->recorded_threads().size());
      budget->record_threads(false);
    }
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  lane.assigned = -1;
  state.running.erase(std::find_if(state.running.begin(), state.running.end(),
                                   [&](const Running& r) { return r.position == position; }));
  if (!state.profiling) state.free_threads += threads;
  ++state.finished;
  if (error) {
    if (!state.first_error) state.first_error = error;
  } else {
    if (state.profiling) {
      // On a lane thread, under the lock: a refused sample ends the step as an error would, it
      // must not escape the thread.
      if (state.profile_threads > 0) try {
          model_.add_sample(keys_[position], threads, seconds);
        } catch (...) {
          if (!state.first_error) state.first_error = std::current_exception();
        }
    } else if (options_.policy == Policy::Auto && tuned_) {
      auto keep = [seconds](std::vector<double>& times) {
        if (times.size() == kMeasurementsKept) times.erase(times.begin());
        times.push_back(seconds);
      };
      try {  // each vector grows to its last 32 timings once; out of memory then, a timing is left out
        keep(measured_[position][threads]);
        if (lane.alone && lane.launch_number == state.launches) keep(measured_alone_[position][threads]);
      } catch (const std::bad_alloc&) {
      }
    }
    for (int s : successors_[position])
      if (--state.waiting[s] == 0) state.ready.push_back(s);
  }
  dispatch(lane_index);
  if (state.done() && lane_index != 0) state.lanes[0]->wake.notify_one();
}

void Executor::dispatch(int preferred_lane) {
  State& state = *state_;
  std::vector<Running>& launches = state.chosen;
  launches.clear();
  if (!state.first_error && !state.ready.empty()) choose(launches);
  for (size_t i = 0; i < launches.size(); ++i) {
    const Running& launch = launches[i];
    State::Lane* lane = state.lanes[preferred_lane]->assigned < 0 ? state.lanes[preferred_lane].get() : nullptr;
    for (size_t l = 0; !lane && l < state.lanes.size(); ++l)
      if (state.lanes[l]->assigned < 0) lane = state.lanes[l].get();
    if (!lane) {  // cannot happen: every launch takes at least one of the threads the lanes match
      state.first_error = std::make_exception_ptr(Error("executor: no idle lane for a launch (a scheduler bug)"));
      // The launches not started leave `running` (and give their threads back), so the step ends
      // with the error once the started ones finish instead of waiting for them forever.
      for (size_t u = i; u < launches.size(); ++u) {
        state.running.erase(std::find_if(state.running.begin(), state.running.end(),
                                         [&](const Running& r) { return r.position == launches[u].position; }));
        if (!state.profiling) state.free_threads += launches[u].threads;
      }
      return;
    }
    lane->assigned = launch.position;
    lane->threads = launch.threads;
    lane->alone = state.running.size() == 1;
    lane->launch_number = ++state.launches;
    last_threads_[launch.position] = launch.threads;
    if (lane != state.lanes[preferred_lane].get()) lane->wake.notify_one();
  }
  int granted = 0;
  for (const Running& r : state.running) granted += r.threads;
  peak_running_ = std::max(peak_running_, static_cast<int>(state.running.size()));
  peak_threads_ = std::max(peak_threads_, granted);
  if (state.running.empty() && !state.done() && !state.first_error)
    state.first_error = std::make_exception_ptr(
        Error(cat("executor: ", state.waiting.size() - state.finished, " steps can never run (a dependency cycle)")));
}

void Executor::choose(std::vector<Running>& launches) {
  State& state = *state_;
  std::vector<int>& ready = state.ready;
  std::sort(ready.begin(), ready.end(), [this](int a, int b) {  // larger bottom level first, then plan order
    if (bottom_levels_[a] != bottom_levels_[b]) return bottom_levels_[a] > bottom_levels_[b];
    return a < b;
  });
  auto launch_front = [&](int threads) {
    launches.push_back({ready.front(), threads, 0.0});
    state.running.push_back(launches.back());
    ready.erase(ready.begin());
  };
  if (state.profiling) {  // one op at a time, at the thread count this run samples
    if (state.running.empty()) launch_front(state.profile_threads == 0 ? capacity_ : state.profile_threads);
  } else if (options_.policy == Policy::Auto) {
    const double now = std::chrono::duration<double>(Clock::now() - state.start).count();
    choose_auto(ready, state.free_threads, now, state.running, launches);
  } else {
    const int grant = grants_[0];
    while (state.free_threads >= grant && !ready.empty()) {
      launch_front(grant);
      state.free_threads -= grant;
    }
  }
}

void Executor::run() {
  State& state = *state_;
  std::unique_lock<std::mutex> lock(state.mutex);
  started_ = true;
  state.run_index = plan_.begin_run();
  state.waiting = predecessor_count_;
  state.ready.clear();
  for (int p = 0; p < static_cast<int>(state.waiting.size()); ++p)
    if (state.waiting[p] == 0) state.ready.push_back(p);
  state.running.clear();
  state.finished = 0;
  state.launches = 0;
  state.profiling = options_.policy == Policy::Auto && !profiled_;
  state.profile_threads = state.profiling ? profile_schedule_[profile_run_] : 0;
  if (options_.policy == Policy::Auto && tuned_ && trials_done_ > 0 && options_.retrial_seconds > 0.0 &&
      settled_seconds_ >= options_.retrial_seconds) {
    tuned_ = false;  // the candidates again, from scratch: the host may have changed since
    start_trial_block();
    if (profiles_unsaved_) save_profiles();
  }
  const bool trial = options_.policy == Policy::Auto && profiled_ && !tuned_;
  if (trial) use_schedule(static_cast<int>(trial_candidate()));  // candidates in turn, a stint each
  state.free_threads = options_.policy == Policy::Auto && profiled_ ? width_ : capacity_;
  state.start = Clock::now();
  state.first_error = nullptr;
  peak_running_ = peak_threads_ = 0;
  if (!state.waiting.empty()) dispatch(0);
  while (!state.done()) {
    if (state.lanes[0]->assigned >= 0)
      run_assigned(0, lock);
    else
      state.lanes[0]->wake.wait(lock, [&] { return state.done() || state.lanes[0]->assigned >= 0; });
  }
  if (state.first_error) std::rethrow_exception(state.first_error);
  const bool settled = options_.policy == Policy::Auto && tuned_ && !state.profiling && !trial;
  if (settled && trials_done_ > 0)
    settled_seconds_ += std::chrono::duration<double>(Clock::now() - state.start).count();
  if (settled && options_.refresh_steps > 0 && ++settled_steps_ % options_.refresh_steps == 0) {
    lock.unlock();  // the lanes are idle between runs
    refresh_model();
  } else if (state.profiling && ++profile_run_ == profile_schedule_.size()) {
    lock.unlock();
    finish_profiling();
  } else if (trial) {
    const double seconds = std::chrono::duration<double>(Clock::now() - state.start).count();
    if (trial_stint() == 1 || trial_run_ % trial_stint() != 0)  // a stint's first step is not timed
      trial_seconds_[trial_candidate()].push_back(seconds);
    trial_time_ += seconds;
    ++trial_run_;
    if (trial_run_ % (kCandidates * trial_stint()) == 0 && trial_run_ >= trial_steps_per_block() &&
        trial_time_ >= options_.trial_seconds) {
      std::vector<double> medians;
      for (size_t c = 0; c < candidate_grants_.size(); ++c) medians.push_back(median_of(trial_seconds_[c]));
      verdicts_.push_back(trial_block_verdict(medians));
      const int choice = trial_choice(verdicts_, kTrialBlocks);
      if (choice >= 0) {
        chosen_ = choice;
        use_schedule(chosen_);
        chosen_grants_ = grants_;  // as the trial ran them (a refreshed model's grants wait for the next)
        tuned_ = true;
        ++trials_done_;
        settled_seconds_ = 0.0;
        chosen_trial_seconds_ = trial_seconds_;
        chosen_verdicts_ = verdicts_;
        verdicts_.clear();
      } else {
        start_trial_block();  // another block
      }
    }
  }
}

int trial_block_verdict(const std::vector<double>& medians) {
  // intra is the baseline to beat: another schedule must be faster by a margin larger than the
  // trial's noise.
  constexpr double kMargin = 0.03;
  if (medians.size() <= kIntraSchedule)
    throw Error(cat("executor: a trial of ", medians.size(), " candidates has no intra"));
  int verdict = kIntraSchedule;
  for (int c = 0; c < static_cast<int>(medians.size()); ++c)
    if (c != kIntraSchedule && medians[c] < (1.0 - kMargin) * medians[kIntraSchedule] && medians[c] < medians[verdict])
      verdict = c;
  return verdict;
}

int trial_choice(const std::vector<int>& verdicts, size_t most_blocks) {
  // A choice takes two blocks that agree (a slow phase of a shared host lasts long enough to
  // decide one block on its own): blocks 1 and 2, or block 3 with one of them; else intra.
  if (verdicts.empty()) return -1;
  for (size_t b = 0; b + 1 < verdicts.size(); ++b)
    if (verdicts[b] == verdicts.back()) return verdicts.back();
  return verdicts.size() >= most_blocks ? kIntraSchedule : -1;
}

std::vector<std::string> Executor::trial_verdicts() const {
  std::vector<std::string> names;
  for (int v : chosen_verdicts_) names.push_back(candidate_names_.at(v));
  return names;
}

double Executor::trial_step_seconds(const std::string& schedule) const {
  for (size_t c = 0; c < candidate_names_.size() && c < chosen_trial_seconds_.size(); ++c)
    if (candidate_names_[c] == schedule && !chosen_trial_seconds_[c].empty()) return median_of(chosen_trial_seconds_[c]);
  return -1.0;
}

std::string Executor::trial_summary() const {
  if (options_.policy != Policy::Auto || (!tuned_ && trials_done_ == 0) || candidate_grants_.size() < 2 ||
      chosen_trial_seconds_.size() < candidate_grants_.size())
    return "";
  std::string verdicts;
  for (int v : chosen_verdicts_) verdicts += cat(verdicts.empty() ? "" : ", ", candidate_names_[v]);
  std::string text = cat("schedule: ", candidate_names_[chosen_], " (trial ", trials_done_, ", its blocks chose ",
                         verdicts, "; in the last block, median step time over ", chosen_trial_seconds_[0].size(),
                         " steps each:");
  for (size_t c = 0; c < candidate_grants_.size(); ++c)
    text += cat(" ", candidate_names_[c], " ", static_cast<int>(1e5 * median_of(chosen_trial_seconds_[c])) / 100.0,
                " ms");
  return text + (options_.retrial_seconds > 0.0 ? cat("; tried again every ", options_.retrial_seconds, " s)") : ")");
}

std::vector<double> Executor::schedule_errors() const {
  std::vector<double> errors;
  if (!profiled_) return errors;
  for (size_t p = 0; p < measured_.size(); ++p)
    for (int threads = 1; threads < static_cast<int>(measured_[p].size()); ++threads) {
      if (measured_[p][threads].empty()) continue;
      const double measured = std::max(median_of(measured_[p][threads]), 1e-9);  // a coarse clock's 0
      errors.push_back(std::abs(model_.predict(keys_[p], threads) - measured) / measured);
    }
  return errors;
}

std::string Executor::explain() const {
  std::string text = cat("policy ", name_of(options_.policy), ", ", capacity_, " threads, ", lanes(), " lanes\n");
  if (options_.policy != Policy::Auto) return text + "(grants and predictions come from the auto policy's model)\n";
  if (!tuned_ && trials_done_ == 0) return text + cat("still tuning: ", tuning_runs_left(), " steps to go\n");
  text += adopted_            ? cat("profiles", adopted_schedule_ ? " and schedule" : "",
                                    " adopted from an earlier executor of this plan\n")
          : loaded_from_cache_ ? cat("profiles from the cache '", options_.profile_cache, "'\n")
                               : cat("profiled over ", profile_schedule_.size(), " steps (", options_.profile_samples,
                                     " samples per op and thread count after ", options_.profile_warmup,
                                     " warm-up steps)\n");
  if (const std::string summary = trial_summary(); !summary.empty()) {
    text += summary + "\n";
    if (!tuned_) text += "(a new trial is under way: the grants below are its current candidate's)\n";
  }
  std::vector<std::vector<std::string>> rows = {
      {"op", "node", "kernel", "grant", "T(1) ms", "pred ms", "meas ms", "bottom ms"}};
  const auto ms = [](double seconds) {
    char cell[32];
    std::snprintf(cell, sizeof(cell), "%.3f", 1e3 * seconds);
    return std::string(cell);
  };
  const std::vector<PlanStep>& steps = plan_.steps();
  for (size_t p = 0; p < steps.size(); ++p) {
    const Node& node = plan_.graph().node(steps[p].node);
    const int threads = last_threads_[p] > 0 ? last_threads_[p] : grants_[p];
    const double measured = median_of(measured_[p][threads]);
    char grant[32];
    std::snprintf(grant, sizeof(grant), "%2d/%-2d", grants_[p], threads);
    rows.push_back({node.op, node.name, steps[p].kernel_name, grant, ms(model_.predict(keys_[p], 1)),
                    ms(model_.predict(keys_[p], threads)), measured >= 0 ? ms(measured) : "-", ms(bottom_levels_[p])});
  }
  text += aligned_table(rows, {24, 34, 13, 5, 10, 10, 10, 11}, 3);
  text += "grant: granted/given in the last step (given differs when a grant was shrunk or widened)\n";
  const std::vector<double> schedule = schedule_errors();
  const std::vector<double> held_out = model_.held_out_errors();
  text += schedule.empty() ? "model error in the schedule: no runs measured yet\n"
                           : cat("model error in the schedule: median ", 100.0 * median_of(schedule), "% over ",
                                 schedule.size(), " op/thread-count pairs\n");
  if (model_refreshes_ > 0)
    text += cat("model refreshed ", model_refreshes_, " time(s) from timings of ops that ran alone: ", refreshed_pairs_,
                " op/thread-count pair(s) replaced\n");
  text += held_out.empty() ? "model error at held-out thread counts: needs 3 or more profiled counts\n"
                           : cat("model error at held-out thread counts: median ", 100.0 * median_of(held_out),
                                 "% over ", held_out.size(), " points\n");
  return text;
}

}  // namespace quiver
