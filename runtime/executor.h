// Executor: runs a Plan's steps concurrently (DESIGN.md section 3, "Concurrency control"). Lanes
// are persistent threads; a lane runs one op at a time inside a thread budget (a TBB arena) of
// the op's grant. Ready ops start while threads are free, highest bottom level first (the
// predicted time from the op to the end of the step along its longest path); a completion
// releases successors (data, control and buffer-reuse edges). The first kernel error stops new
// launches, lets running ops finish and is rethrown naming the node: nothing hangs.
//
// Policies:
//   serial  one op at a time on one thread: the reference.
//   intra   one op at a time on all threads (TensorFlow's recommended setting on one socket).
//   fixed   `inter` ops side by side, `intra` threads each (TensorFlow's inter/intra-op pools).
//   auto    the performance model decides: the first steps profile every op key at thread
//           counts 1..min(P, 8), then doubling, and P (PerfModel::profiled_counts; one op at a
//           time, several samples each, unless the profile cache has
//           them); then each op is granted the fewest threads predicted within `grant_tolerance`
//           of its best, ops co-run on disjoint budgets summing to at most P, and a grant is
//           shrunk to the free threads when starting now is predicted to finish sooner than
//           waiting; while an op is the only one ready it may use as many threads as help it
//           (not under the narrow candidate below).
//           The model cannot see interference between co-running ops (shared caches, memory
//           bandwidth), so before settling, auto runs its schedule against three plain ones
//           under the same scheduler, every op on all P threads (intra), every op on one
//           thread side by side (narrow) and one op at a time on one thread (serial), in
//           turn, `trial_stint` steps each with the first not timed, in blocks of at least
//           `trial_rounds` timed steps each and `trial_seconds`;
//           each block names the fastest (intra unless another is faster by more than 3%),
//           and auto keeps what two blocks agree on (else intra). It tries again after
//           `retrial_seconds` of steps.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/perf_model.h"
#include "runtime/plan.h"

namespace quiver {

enum class Policy { Serial, Intra, Fixed, Auto };

Policy parse_policy(const std::string& name);  // "serial" | "intra" | "fixed" | "auto"; throws otherwise
const char* name_of(Policy policy);

class ThreadAllowance;

struct ExecutorOptions {
  Policy policy = Policy::Serial;
  int threads = 1;  // intra and auto: the threads the executor may use
  int inter = 1;    // fixed: ops side by side
  int intra = 1;    // fixed: threads per op
  bool record_threads = false;  // note which threads ran each op's kernel work (tests)
  // auto:
  int profile_warmup = 2;        // steps run before profiling: first touches, oneDNN's first calls
  int profile_samples = 5;       // timings per op key and thread count before fitting
  double grant_tolerance = 0.05; // a grant's predicted time is within 5% of the op's best...
  double grant_slack_s = 5e-6;   // ...or within 5 us of it: a thread that saves less is not worth it
  int trial_rounds = 5;          // steps per candidate schedule when choosing among them, at least,
  double trial_seconds = 0.25;   // ...and more rounds until the trial has lasted this long: a choice
                                 // between sub-millisecond steps needs more than 5 samples each
  // A candidate runs this many steps in a row and the first is not timed: it starts from the
  // caches and threads the previous candidate left, which the settled schedule, following itself,
  // never does. 1: candidates alternate step by step, every step timed.
  int trial_stint = 3;
  // Try the candidates again after this many seconds of steps on the chosen schedule (time in
  // run(), not wall time: an executor left idle does not retry on waking; 0: never). A shared
  // host's speed comes in phases (another tenant takes a core for a while): a choice made in one
  // phase can cost for the rest of a run in the next. A trial costs a few slower steps a period.
  double retrial_seconds = 10.0;
  std::string profile_cache;     // load profiles from / save them to this file; "" for none
  // false: load the cache but never write it. A learner beside other learners times its ops
  // while theirs run on the other cores: contended timings that would steer every later run
  // (a single model's among them) that loads the cache.
  bool save_profiles = true;
  // auto, once settled: every `refresh_steps` steps, an op key timed at least 5 times while it ran
  // alone (no other op running or started meanwhile) at a thread count, with a median more than
  // `refresh_tolerance` away from the model's prediction there, has its samples at that count
  // replaced by those timings; the model is refit and its candidate grants derived again (used
  // from the next trial on), and the cache is rewritten at the next trial or when the executor
  // goes. A profile cached in a busy moment, or a host that has changed since, heals itself
  // instead of steering every later run. 0: never.
  int refresh_steps = 50;
  double refresh_tolerance = 0.25;
};

// What an auto executor has learned about its plan: the fitted profiles and, once a trial has
// chosen, the schedule it chose with the trial's figures. An executor of the same plan at the same
// thread count adopts it instead of profiling and trying the candidates again (LearnerGroup: a
// configuration the learner tuner returns to would otherwise spend half a second of slower steps
// repeating a trial it ran seconds before).
struct ExecutorTuning {
  std::vector<std::string> keys;  // the plan's op keys, in step order
  int threads = 0;
  PerfModel model{1};
  int trials_done = 0;  // 0: profiles only, no schedule chosen yet
  int schedule = 0;     // the chosen candidate ("model", "intra", "narrow", "serial")
  std::vector<int> grants;  // its grants per step position, as the trial ran them
  // Seconds on the chosen schedule since that trial (the retrial clock); a retrial under way when
  // this was taken has them at or past the period, so the adopter's first step starts it again.
  double settled_seconds = 0.0;
  std::vector<std::vector<double>> trial_seconds;  // the choice's last block, per candidate
  std::vector<int> verdicts;                       // the choice's blocks
};

// The auto trial's rules, for its candidates numbered as ExecutorTuning::schedule (intra is 1).
// A block's verdict from each candidate's median step time in it: the fastest candidate that beats
// intra by more than 3% of intra's time (more than a trial's noise), else intra.
int trial_block_verdict(const std::vector<double>& medians);
// The choice after the blocks' verdicts so far: the latest verdict when an earlier block agrees
// with it, intra once `most_blocks` have run without two agreeing, else -1 (another block).
int trial_choice(const std::vector<int>& verdicts, size_t most_blocks);

class Executor {
 public:
  Executor(Plan& plan, ExecutorOptions options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void run();  // one step of the plan
  Policy policy() const { return options_.policy; }
  int lanes() const;
  int threads() const { return capacity_; }  // threads the executor may use at once
  // auto: true once every op has a fitted profile (after profiling runs or from the cache).
  bool profiled() const { return profiled_; }
  // True once the schedule is settled: always for serial, intra and fixed; for auto after
  // profiling and the trial of candidate schedules.
  bool tuned() const { return options_.policy != Policy::Auto || tuned_; }
  // Profiling and trial steps still to run (at least: the trial goes on, a stint of every
  // candidate at a time, until it has lasted trial_seconds).
  int tuning_runs_left() const;
  // auto: the schedule it settled on ("model", "intra", "narrow" or "serial"); another policy's
  // one schedule is named after the policy ("serial", "intra", "fixed").
  const std::string& chosen_schedule() const { return candidate_names_.at(chosen_); }
  // auto: trials of the candidate schedules completed so far (one, then one per retrial period).
  // A trial is two or three blocks of the candidates' stints (each block at least trial_rounds
  // timed steps per candidate and trial_seconds): it chooses what two blocks agree on, else intra.
  int trials_done() const { return trials_done_; }
  // The last completed trial's blocks: the schedule each found fastest, in order.
  std::vector<std::string> trial_verdicts() const;
  // auto: the median step time of candidate `schedule` ("model", "intra", "narrow", "serial") in
  // the last completed trial's last block (the figure explain() prints); negative before a trial,
  // for an unknown name, and under the other policies (they try no candidates).
  double trial_step_seconds(const std::string& schedule) const;
  bool loaded_from_cache() const { return loaded_from_cache_; }
  // auto, once profiled: what this executor has learned; empty before, and under other policies.
  std::optional<ExecutorTuning> tuning() const;
  // auto, before the first run: start from `tuning`, taken from an executor of the same plan (the
  // same op keys) at the same thread count, instead of profiling, and, where it had chosen a
  // schedule, run that one (with the grants its trial ran) without a trial; the retrial clock
  // goes on from where it was. Returns false and changes nothing otherwise (another plan, thread
  // count or policy, after a run, a model without every op's profile at every count profiling
  // times, or a choice that names no candidate, grants other than its schedule's, or a trial
  // figure or retrial clock that is not a time).
  bool adopt(const ExecutorTuning& tuning);
  bool adopted() const { return adopted_; }
  const std::vector<double>& bottom_levels() const { return bottom_levels_; }
  const std::vector<int>& grants() const { return grants_; }         // per step position
  const std::vector<int>& last_threads() const { return last_threads_; }  // threads given in the last run
  // In the last run: the most ops running at once, and the most threads granted at once.
  int peak_running() const { return peak_running_; }
  int peak_threads() const { return peak_threads_; }
  // With record_threads: distinct threads that ran each op's parallel work in the last run.
  const std::vector<int>& threads_used() const { return threads_used_; }
  const PerfModel& model() const { return model_; }
  // auto: how often the model was refreshed from the settled schedule's own timings, and the
  // (op key, thread count) pairs replaced in all (ExecutorOptions::refresh_steps).
  int model_refreshes() const { return model_refreshes_; }
  int refreshed_pairs() const { return refreshed_pairs_; }
  // |predicted - measured| / measured per op run after profiling, at the threads it was given
  // (medians of its executions): how well the model predicts the schedule it drives.
  std::vector<double> schedule_errors() const;
  // Per op: kernel, grant, predicted and measured time, bottom level; model accuracy at the end.
  std::string explain() const;
  // auto, once a trial has chosen: one line on the choice ("schedule: intra (trial 1, its blocks
  // chose intra, intra; in the last block, median step time ...: model 1.2 ms intra 1.1 ms ...)"),
  // the line explain() prints about it, also for a schedule adopted with its trial's figures;
  // empty before a trial and where there are no candidates to try.
  std::string trial_summary() const;

 private:
  struct State;
  struct Running {
    int position = 0, threads = 1;
    double predicted_finish = 0.0;  // seconds from the start of the run
  };
  void finish_profiling();
  // The model's grants for every position: the "model" candidate schedule.
  std::vector<int> model_grants() const;
  void refresh_model();  // see ExecutorOptions::refresh_steps
  void save_profiles();
  // The lanes: lane 0 is the thread that calls run(), the others are persistent threads. Whoever
  // finishes an op updates the run under the mutex and launches what is ready, keeping the next
  // op for itself when it can, so a chain of ops runs on one thread without hand-offs.
  void lane_main(int lane);
  void stop_lanes();  // stops and joins every lane thread started
  void run_assigned(int lane, std::unique_lock<std::mutex>& lock);
  void dispatch(int preferred_lane);
  // Which ready ops to start now, and with how many threads, by policy.
  void choose(std::vector<Running>& launches);
  // auto, after profiling.
  void choose_auto(std::vector<int>& ready, int& free_threads, double now, std::vector<Running>& running,
                   std::vector<Running>& launches) const;

  Plan& plan_;
  ExecutorOptions options_;
  int capacity_ = 1;
  std::vector<std::vector<int>> successors_;
  std::vector<int> predecessor_count_;
  std::vector<double> bottom_levels_;
  std::vector<std::string> keys_;
  std::vector<int> grants_;
  std::vector<int> last_threads_;
  std::vector<int> threads_used_;
  int peak_running_ = 0, peak_threads_ = 0;
  // Recent execution times after profiling, per position and thread count; and those of them
  // during which the op ran alone (refresh_model()'s evidence).
  std::vector<std::vector<std::vector<double>>> measured_, measured_alone_;
  int64_t settled_steps_ = 0;
  int model_refreshes_ = 0, refreshed_pairs_ = 0;
  bool profiles_unsaved_ = false;  // refreshed since the cache was last written
  bool cache_failed_ = false;      // a save failed: no more are tried
  PerfModel model_;
  // model_'s predictions by position and thread count (1..capacity_), and each position's fastest
  // count, tabled after every fit: the scheduler asks for them at every launch, and a lookup by
  // op key (a string) each time cost a few percent of a sub-millisecond step.
  std::vector<std::vector<double>> predicted_;
  std::vector<int> fastest_;
  void refit();  // model_.fit() and the table from it: the only way the model is fitted here
  std::vector<int> profile_schedule_;  // thread count of each remaining profiling run (0: warm-up)
  size_t profile_run_ = 0;
  bool profiled_ = false;
  // Candidate schedules tried after profiling, and their step times. A schedule is the grant
  // of each position and its width, the threads in use at once (the executor's capacity, or 1
  // for `serial`: one op at a time on one thread).
  void use_grants(const std::vector<int>& grants);
  void use_schedule(int candidate);
  void start_trial_block();  // forgets the current block's step times
  std::vector<std::string> candidate_names_{"model"};
  std::vector<std::vector<int>> candidate_grants_;
  std::vector<int> candidate_widths_;
  int width_ = 1;  // threads in use at once under the current schedule
  // An op alone in the ready queue may take the threads that still speed it up: under every
  // schedule but narrow, which is one thread per op whatever the queue holds.
  bool widen_alone_ = true;
  std::vector<std::vector<double>> trial_seconds_;
  size_t trial_run_ = 0;
  size_t trial_stint() const;      // steps per candidate in a row (options_.trial_stint, at least 1)
  size_t trial_candidate() const;  // the candidate of trial step trial_run_
  size_t trial_steps_per_block() const;  // the fewest steps of one block: trial_rounds timed each
  double trial_time_ = 0.0;  // seconds of trial steps so far
  int chosen_ = 0;
  bool tuned_ = false;
  int trials_done_ = 0;
  double settled_seconds_ = 0.0;  // time spent in run() on the chosen schedule since the last trial
  std::vector<int> verdicts_;  // the current trial's blocks: the candidate each found fastest
  std::vector<std::vector<double>> chosen_trial_seconds_;  // the step times of the last choice's last block
  std::vector<int> chosen_verdicts_;
  std::vector<int> chosen_grants_;  // the chosen schedule's grants when the trial chose it
  bool loaded_from_cache_ = false;
  bool adopted_ = false;           // started from another executor's tuning (adopt())...
  bool adopted_schedule_ = false;  // ...and its chosen schedule
  bool started_ = false;  // run() has been called
  // TBB's limit raised for the workers the grants may use at once (capacity_ less the lane
  // threads running ops), where that is more than the cores: see ThreadAllowance.
  std::unique_ptr<ThreadAllowance> allowance_;
  std::unique_ptr<State> state_;
};

}  // namespace quiver
