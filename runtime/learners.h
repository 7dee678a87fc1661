// LearnerGroup: k replicas of a model ("learners") trained at once and kept consistent by
// synchronous model averaging (Crossbow; DESIGN.md section 3, "Learners and SMA"). A learner owns
// one replica's flat buffers (parameters, gradients, momentum) through its own Trainer, a
// pre-step snapshot of its parameters where SMA needs one (Adam, CUDA; after momentum SGD on the
// CPU it is recovered from the velocity), its compiled plan and executor (the thread budget it
// was granted), and a stream on which its steps run (learner 0 has none: its steps run on the
// calling thread, which would otherwise only wait). A round gives every learner one batch and
// runs the k steps at once; on the CPU the learners then meet and each applies a share of SMA,
// on a GPU SMA follows on sync streams. z, the average model, is what is evaluated.
//
// fit() trains on a dataset: one prefetching batcher serves every learner (a round takes k
// batches), z is evaluated after each epoch, and with `tune` the number of learners is tuned while
// training (Crossbow): start with one learner on all cores (or `tune_cores`), measure samples/s over a window, add a
// learner (threads split evenly) while the gain exceeds `tune_threshold`, where one does not, try
// twice as many once (`tune_leap`), then step back to the best and keep it; a close call is
// measured twice (runtime/learner_tuner.h). A change of k rebuilds the replicas from z (like a learning-rate drop);
// on the CPU, the replicas of a configuration the group ran before start from what its executor
// had learned (its profiles and chosen schedule: Executor::adopt), not from a new trial.
// One learner with the default alpha has nothing to average: it trains exactly like single-stream
// training and z is its model, so the tuner's starting point is single-stream itself.
//
// On a CUDA device (TrainOptions::device) every learner's plans run on the learner's own
// non-blocking stream and SMA runs on a separate sync stream per device (DeviceSma), ordered
// against the learners' streams by events only: the host waits for a learner's loss, never for a
// whole device. With `devices` > 1 the learners are spread round-robin over that many GPUs and
// the per-device corrections are all-reduced with NCCL. Synchronous SGD is CPU-only for now.
//
// The clock gate: synchronous by default (a round ends when every learner's step is done, then
// SMA). With a staleness bound s > 0 (CPU learners, SMA) a learner's step and the absorption of
// its correction into z run as one task on its stream, and a round returns as soon as no learner
// has more than s rounds left to run: learners never wait for each other at a round's end, and
// one learner's memory-bound SMA pass overlaps another's compute. The result then depends on
// timing (not reproducible bit for bit); every reader of z or of the replicas waits for the
// learners first.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "runtime/batcher.h"
#include "runtime/cpu_stream.h"
#include "runtime/device_sma.h"
#include "runtime/learner_tuner.h"
#include "runtime/sma.h"
#include "runtime/thread_budget.h"
#include "runtime/trainer.h"

namespace quiver {

// How learners are kept consistent: SMA (each learner steps on its own, then models are averaged
// with corrections), or synchronous SGD (the k gradients are averaged and one update is applied
// to one model that every learner then copies: k learners of batch b = one learner of batch k*b).
enum class Sync { Sma, Ssgd };

// The largest staleness bound: a round's batches are kept until no learner can still need them.
constexpr int kMaxStaleness = 64;
// The longest sync period (LearnerOptions::sync_period), in rounds.
constexpr int kMaxSyncPeriod = 1000;

// How k learners' learning rate follows k (one learner, and so single-stream, is never changed).
// k learners of batch b move z about as one model of batch k x b would (docs/benchmarks.md, "What
// a second learner costs in samples"). Linear gives that batch the step size of k steps (measured
// here: two LSTM learners reached 79.2% test accuracy after 2 epochs at lr 0.02 against 76.0% at
// 0.01, single-stream 81.9%); square root, sqrt(k) x lr, the step that keeps the noise of an
// update per sample as it was (Krizhevsky 2014; Hoffer et al. 2017), between the two.
enum class LrScaling { None, Linear, Sqrt };
LrScaling parse_lr_scaling(const std::string& name);  // "none" | "linear" | "sqrt"; throws otherwise
double lr_scale(LrScaling rule, int learners);        // the factor k learners' learning rate takes

struct LearnerOptions {
  int learners = 2;
  int threads_per_learner = 1;  // each learner's executor gets this many threads
  SmaOptions sma;
  Sync sync = Sync::Sma;
  // fit(): tune the number of learners while training, starting from one. Once the tuner has
  // settled, later fit()s keep its choice (over the same cores) rather than tune again.
  bool tune = false;
  double tune_threshold = 0.10;  // add a learner while samples/s rises by more than this
  double tune_confirm_band = 0.10;  // a gain within this of the threshold is measured twice (learner_tuner.h)
  bool tune_confirm_gains = true;   // ...and so is every gain above it (false: a clear gain on one window)
  int tune_window = 20;          // rounds measured per configuration, after its warm-up...
  double tune_window_seconds = 0.5;  // ...and at least this long: short windows on a shared machine are noise
  // A new configuration whose window reads, after a quarter of its rounds and of its seconds,
  // below (1 - tune_cut_below) x the best so far ends its window there (learner_tuner.h): a clear
  // loss costs a quarter of a window instead of a whole one. false: every window runs in full.
  bool tune_cut_short = true;
  double tune_cut_below = 0.10;
  // CPU: one-thread learners are not run when they cannot gain. Each would run its steps as the
  // lone learner's executor ran its `serial` candidate in its trial (one op at a time on one
  // thread), so k of them can reach about k x batch / that schedule's median step and no more
  // (the SMA pass and learners sharing caches and memory bandwidth only lower it; measured here,
  // a one-thread trainer's step is no faster than that candidate's). An estimate no more than
  // (1 + tune_threshold) x the best settles the tuner without the trial's window
  // (LearnerTuner::bounded(), one_thread_bound()). Applies where one learner of several threads
  // is followed by learners of one thread: 2 or 3 cores. false: every configuration is run.
  bool tune_bound = true;
  // Where one more learner fails to gain, try twice that many once before settling (at most
  // max_learners; learner_tuner.h, "A plateau is leapt over once"). false: Crossbow's add-one
  // rule alone, as before 2026-11-26.
  bool tune_leap = true;
  // A new configuration's warm-up (not measured): its executors' profiling and trial (what a
  // configuration run before had finished of them is adopted, not run again), 3 rounds, and at
  // least this long. On a GPU the first rounds of fresh learners pay one-time costs (library
  // handles' first calls, pinned staging buffers) that otherwise land in the measured window.
  double tune_warmup_seconds = 0.2;
  // 0: the tuner's cores (CPU: a learner at least a core each), 8 per GPU (CUDA). On the CPU an
  // explicit ceiling above the tuner's cores is an error when tuning (learners would share cores).
  int max_learners = 0;
  int tune_cores = 0;            // CPU: the cores the tuner splits among learners (0: all available)
  int devices = 1;               // CUDA: spread the learners over this many GPUs, from TrainOptions::device on
  // The clock gate: 0 = synchronous rounds; s > 0 = a learner may be up to s rounds behind the
  // caller (CPU learners under SMA; see the top of this file).
  int staleness = 0;
  // SMA every this many rounds (synchronous rounds only): the rounds between are local steps,
  // with neither the learners' meeting nor SMA's pass, and a sync round's correction takes each
  // replica as it was before that round's step, as every round's does at 1 (the default, the
  // rule of DESIGN.md). Longer periods spend fewer passes over the parameters per sample (at
  // batch 16 on 2 cores the MLP's pass is a quarter to a third of a round), but z moves only
  // every period and the replicas drift apart in between: two MLP learners at 4 needed 1.4-2.3x
  // the samples to 85% at mu_z 0.9, 0.95-1.2x at mu_z 0 (docs/benchmarks.md, "A sync period").
  // resize() and reset_replicas() fold the local steps since the last sync into z before they
  // start the replicas from it, and fit() does at the end of every epoch (before z is evaluated
  // and saved) and at its start where rounds ran outside it; the tuner ends its windows on sync rounds, so the resizes after its windows have
  // nothing to fold. Evaluations inside an epoch (eval_every) and round() alone see z as of the
  // last sync.
  int sync_period = 1;
  // The learning rate of k learners (LrScaling): applies to SMA and synchronous SGD alike, and
  // follows k when the tuner changes it. None by default.
  LrScaling lr_scaling = LrScaling::None;
};

// Bytes one learner needs (Trainer::memory_bytes and, with `snapshot`, a pre-step copy of the
// parameters), estimated from one compiled replica.
int64_t learner_bytes(const Trainer& replica, bool snapshot = true);

class LearnerGroup {
 public:
  // `train` is the recipe of every learner (batch = per-learner batch, policy, seed: every
  // replica and z start from the same seeded parameters); its `threads` is ignored (the
  // learners' come from `options`), and so are `epochs` and `max_steps`: fit() takes its own.
  LearnerGroup(ModelSpec model, TrainOptions train, LearnerOptions options);
  ~LearnerGroup();

  int learners() const { return static_cast<int>(learners_.size()); }
  int threads_per_learner() const { return threads_per_learner_; }
  // Rebuilds the group as k learners of `threads` threads each, every replica starting from z with
  // the optimizer state (momentum) of an old replica (new learner j takes that of old learner j mod
  // the old count), and z goes on with its own momentum (SMA's last move), so a change of
  // configuration restarts neither. Under a sync period z first takes the old replicas' steps
  // since the last sync (fold_local_steps()).
  // Refuses (quiver::Error, nothing changed) when k replicas would not fit in available memory.
  // With tune, the caller's configuration overrules the tuner only until the next fit() starts:
  // tuned() turns false (the history stays the record of what the tuner measured), a fit() under
  // way (the resize from its callback) keeps this configuration for the rest of it, and the next
  // fit() tunes again from the tuner's own start (one learner per device, all cores), not from it.
  // To train on at a configuration of one's own, make the group without tune.
  void resize(int learners, int threads_per_learner);
  // Trains for `epochs` more epochs (or `max_rounds` rounds when > 0) on `train`, evaluating z on
  // `test` after each epoch. Samples/s count every learner's samples. An epoch cut short before
  // (max_rounds, a callback, a checkpoint saved then) goes on where it stopped (over a training set
  // of the same size; otherwise it starts again, with a warning), and counts as the first of the
  // `epochs`. Epochs are numbered from the start of training (epochs_done() + 1 first). Under a
  // sync period every epoch, a cut one too, ends by folding its local steps into z. An epoch's
  // last round counts it done (a save from then on records it so); under a staleness bound a
  // learner's error in that round surfaces after it was counted, and load() puts the count back
  // with the rest. Refused before training: samples that do not fit the model, labels past its
  // classes, a round larger than an epoch (also at any later epoch's start, where a callback grew
  // the group). Not from one of its own callbacks (refused).
  TrainReport fit(const Dataset& train, const Dataset* test, int64_t epochs, int64_t max_rounds = 0);
  void on_progress(std::function<void(const Progress&)> callback) { progress_ = std::move(callback); }
  // Called after each epoch (evaluation of z included), off the training clock (the tuner's
  // windows do not count it either); returning false ends fit() there. It may save().
  void on_epoch(std::function<bool(const EpochReport&)> callback) { epoch_done_ = std::move(callback); }
  // Called after every evaluation of z on the test set in fit() (after each epoch and every
  // TrainOptions::eval_every batches); returning false ends fit() there.
  void on_evaluation(std::function<bool(const Evaluation&)> callback) { evaluated_ = std::move(callback); }
  // With tune: every configuration measured, in order, and the one kept.
  const std::vector<TunerStep>& tuner_history() const { return history_; }
  // With tune: true once the tuner has settled (the last history entry is its choice).
  bool tuned() const { return tuned_; }
  // Profiling and trial steps the learners' executors (auto policy) still have to run: their
  // steps are not representative until then. Settles first.
  int64_t executor_tuning_runs_left() const;
  // CPU, one learner of several threads under the auto policy, after its executor's trial: the
  // samples/s `learners` learners of one thread each could reach at most, learners x batch / the
  // median serial step of that trial (LearnerOptions::tune_bound). Negative when not known.
  double one_thread_bound(int learners) const;
  // Learner j's executor (nullptr when its policy runs none). Settles first.
  const Executor* learner_executor(int j) const {
    settle();
    return learner_at(j).trainer->executor();
  }
  // One round: learner j trains on samples [j*b, (j+1)*b) of `images` / `labels` (b the
  // per-learner batch), all learners at once; then SMA. Returns the learners' mean loss. A
  // learner's error (a NaN loss) is rethrown after every learner has finished its step.
  // With a staleness bound s, the round returns once no learner is more than s rounds behind:
  // the batches must stay valid until s more rounds have returned (or settle()), the loss is the
  // mean of each learner's latest finished step, and a learner's error surfaces at a later round;
  // a round that throws has let every learner finish what it was given, so no batch is in use.
  double round(const float* images, const int32_t* labels);
  // The same with the sizes checked: k x batch x features floats and k x batch labels.
  double round(std::span<const float> images, std::span<const int32_t> labels);
  // The same with learner j's batch at images[j] / labels[j] (k pointers each): no gathering copy.
  double round(const std::vector<const float*>& images, const std::vector<const int32_t*>& labels);
  // z, the average model, as a flat buffer shaped like every replica's parameters. Waits for every
  // learner and, on a GPU, for the SMA's sync streams, so the caller may read it at once.
  const Tensor& average() const;
  ParamStore& replica(int j) {
    settle();  // a learner behind under a staleness bound may be writing it
    return learner_at(j).trainer->params();
  }
  // Top-1 accuracy of z.
  double evaluate(const Dataset& data);
  // Every replica becomes z (after a learning-rate drop). Under a sync period the replicas' steps
  // since the last sync are folded into z first (see fold_local_steps()), so none is lost.
  void reset_replicas();
  // The learners train at TrainOptions::learning_rate x the lr scaling's factor for their count x
  // `factor`. fit() sets it from the step decay (TrainOptions::lr_drop_epochs) at each epoch, a
  // resumed run's first too. A change is a learning-rate drop: under SMA every replica is reset
  // to z (DESIGN.md section 3; synchronous SGD's replicas are z's copies already). Throws on a
  // factor that is not positive and finite.
  void set_learning_rate_factor(double factor);
  double learning_rate_factor() const { return lr_factor_; }
  // The rate every learner trains at now.
  double learning_rate() const { return learners_.front()->trainer->learning_rate(); }
  // Checkpoints of z: written atomically with a checksum; loading verifies it and the model,
  // sets z, and restarts every replica from it (their momentum cleared, z's own too), so training
  // resumes from z: a warm restart, not the replicas' exact state. Between the syncs of a sync
  // period the file holds z and the progress (rounds, samples of the epoch) as of the last sync.
  // A load is also the recovery after a learner's error (a NaN loss): one not reported yet (under
  // a staleness bound) is dropped with a warning. Not from a fit() callback (refused: fit() would
  // go on counting its own rounds and epochs over the loaded ones); a save there is fine.
  void save(const std::string& path) const;
  void load(const std::string& path);
  int64_t rounds_done() const { return rounds_done_; }
  // Epochs trained to their end (a cut one, by max_rounds or a callback, does not count): the
  // next fit(), or a run resumed from a checkpoint, starts the data order after them.
  int64_t epochs_done() const { return epochs_done_; }
  // Samples of the next epoch trained already (a cut epoch; 0 after a complete one).
  int64_t epoch_samples_done() const { return epoch_samples_done_; }
  // The size of the training set the cut epoch's order was drawn for (0: none cut, or not recorded).
  int64_t epoch_data_samples() const { return epoch_data_samples_; }
  int staleness() const { return options_.staleness; }
  // Waits until every learner has run every round given to it (a no-op for synchronous rounds)
  // and rethrows a learner's error. Everything that reads z or the replicas calls it first.
  void settle() const;
  // On devices: waits until the sync streams are idle, the last round's SMA done (before z is
  // read or replaced, and at the end of a timed window). Nothing to wait for on the CPU.
  void drain();

 private:
  struct Learner {
    std::unique_ptr<Trainer> trainer;
    Tensor snapshot;  // parameters before this round's step (s_j)
    std::atomic<double> loss = 0.0;  // of its latest step (written by the thread that ran it)
    // Learner 0's work runs on the caller's thread: a stream of its own only from learner 1 on.
    std::unique_ptr<CpuStream> stream;
  };
  void build(int learners, int threads_per_learner, bool carry_state = false);
  // Under a sync period z holds the replicas' steps up to the last sync round only. Before the
  // replicas are reset to z or rebuilt from it, an extra sync round folds the steps since then in:
  // SMA's pass with each replica's parameters standing for its snapshot (c_j = alpha (w_j - z)),
  // z's momentum included as at every sync. Nothing to do at a sync round, with one learner
  // alone, or at a period of 1. Returns whether it folded (z moved).
  bool fold_local_steps();
  // The rate each of `learners` learners trains at under the drop factor `factor`: the recipe's
  // rate x the lr scaling's factor for that count x `factor`.
  double learner_learning_rate(int learners, double factor) const;
  ModelSpec model_;
  TrainOptions train_;
  LearnerOptions options_;
  int threads_per_learner_ = 1;
  bool spinning_ = true;  // the learners' threads fit the cores: waits spin before they sleep
  std::function<void(const Progress&)> progress_;
  std::function<bool(const EpochReport&)> epoch_done_;
  std::function<bool(const Evaluation&)> evaluated_;
  std::vector<TunerStep> history_;
  bool tuned_ = false;
  int tuned_cores_ = 0;   // the cores the tuner worked over (a later fit() keeps its choice over these)
  bool tuner_overruled_ = false;  // resize() called since fit() began: the tuner stops
  bool fitting_ = false;  // a fit() is running (FitInProgress)
  // What the latest group of each configuration (learners, threads each) had learned, from its
  // first learner's executor (profiles, and the schedule once its trial chose): every replica of
  // that configuration built again starts from it instead of profiling and trying schedules again
  // (a configuration the tuner returns to: A B B A's last window, the way back after a failed
  // growth). Keyed by the whole configuration: a trial chose among schedules under the contention
  // of that many learners.
  std::map<std::pair<int, int>, ExecutorTuning> tunings_;
  // With TrainOptions::trace_path: every learner's ops and the group's work. Declared before the
  // learners, whose plans record into it, so it outlives them.
  std::unique_ptr<Trace> trace_;
  // On the CPU: TBB may run every learner's threads at once, also where they outnumber the cores.
  // Declared before the learners, whose arenas count on it.
  std::unique_ptr<ThreadAllowance> allowance_;
  std::vector<std::unique_ptr<Learner>> learners_;
  std::unique_ptr<Trainer> average_;  // its parameters are z; used for evaluation only
  std::unique_ptr<SmaSync> sma_;
  Tensor ssgd_velocity_;  // synchronous SGD: the one model's momentum
  void ssgd_update();
  std::unique_ptr<ThreadBudget> sync_budget_;  // synchronous SGD's update runs between rounds on all learners' cores
  std::unique_ptr<DeviceSma> device_sma_;      // on CUDA devices: SMA on sync streams
  std::vector<Device> devices_;               // where learner j lives: devices_[j % size]
  bool sma_from_velocity() const;
  bool needs_snapshot() const;  // SMA that reads a pre-step copy of the parameters (Adam, CUDA)
  bool alone() const;
  double round_within_staleness(const std::vector<const float*>& images, const std::vector<const int32_t*>& labels);
  void refresh_average() const;
  // With a trace (TrainOptions::trace_path): records the group's own work since `start_us` (a
  // feeder hand-over, a sync pass) in round `round`, as learner `learner`'s when >= 0.
  void trace_group_work(const char* name, const char* kind, int64_t start_us, int64_t round, int learner = -1) const;
  int64_t trace_clock() const { return trace_ ? trace_->now_us() : 0; }  // a start for trace_group_work
  // One learner's batch on the host: its images and labels.
  int64_t batch_bytes() const { return quiver::batch_bytes(batch_, features_); }
  // How many batches fit()'s Batcher assembles ahead (BatcherOptions::prefetch_depth).
  int prefetch_depth() const;
  // Learner j, or a quiver::Error naming the group's count.
  const Learner& learner_at(int j) const {
    if (j < 0 || j >= learners()) throw Error(cat("learners: no learner ", j, " of ", learners()));
    return *learners_[static_cast<size_t>(j)];
  }
  mutable bool average_stale_ = false;
  int64_t batch_ = 0, features_ = 0;
  int64_t rounds_done_ = 0, epochs_done_ = 0;
  int64_t last_sync_round_ = 0;  // the last round whose end left z holding every replica's steps
  double lr_factor_ = 1.0;       // set_learning_rate_factor()
  int64_t epoch_samples_done_ = 0;
  // epochs_done_ and epoch_samples_done_ as of the last sync (last_sync_round_): what a checkpoint
  // saved between syncs records with z. Rounds run by round() alone take no samples of fit()'s
  // epoch.
  int64_t epochs_done_at_sync_ = 0, epoch_samples_at_sync_ = 0;
  // z holds every round trained: a sync round, a fold, a rebuild.
  void mark_synced() {
    last_sync_round_ = rounds_done_;
    epochs_done_at_sync_ = epochs_done_;
    epoch_samples_at_sync_ = epoch_samples_done_;
  }
  // Sets the position in the data (epochs done, samples of the next one), and its value at the
  // last sync where z holds every round (fit() counts a round's samples after round() has
  // returned; an epoch's last round counts the epoch done at once, so that a save from then on
  // records no cut epoch of a whole epoch's samples).
  void set_epoch_position(int64_t epochs, int64_t samples) {
    epochs_done_ = epochs, epoch_samples_done_ = samples;
    if (last_sync_round_ == rounds_done_) epochs_done_at_sync_ = epochs, epoch_samples_at_sync_ = samples;
  }
  void set_epoch_samples(int64_t samples) { set_epoch_position(epochs_done_, samples); }
  int64_t epoch_data_samples_ = 0;  // the training set's size the cut epoch's order was drawn for (0: unknown)
};

}  // namespace quiver
