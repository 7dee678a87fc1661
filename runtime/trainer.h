// Trainer: single-learner training of a ModelSpec on a Dataset. It builds the step graph
// (forward, loss, backward, optimizer update) for the training batch size and a forward-only
// graph for evaluation, both over one ParamStore; feeds batches from a prefetching Batcher;
// stops with quiver::Error (naming the step) on a non-finite loss; and reports loss, accuracy and
// throughput. Multi-learner training builds on the same pieces. The loss is known only once the
// step, its update included, has run: after that error the parameters hold the step that made
// it (non-finite, as a rule), and so does the optimizer's state: a caller who goes on starts
// again from a checkpoint with restart_from().
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"  // what every call here throws: quiver::Error
#include "core/nn.h"
#include "runtime/executor.h"
#include "runtime/fashion_mnist.h"
#include "runtime/memory.h"
#include "runtime/param_store.h"
#include "runtime/plan.h"

namespace quiver {

struct TrainOptions {
  int64_t batch = 64;
  int64_t epochs = 1;
  int64_t max_steps = 0;  // 0: no limit
  int threads = 1;
  std::string optimizer = "sgd";  // sgd | adam
  double learning_rate = 0.01;
  // Step decay: at the start of each epoch listed (numbered from the start of training, from 2,
  // strictly rising) the learning rate is multiplied by lr_drop_factor, so epoch e trains at
  // learning_rate x lr_drop_factor ^ (drops listed up to e). fit() follows it, a resumed run
  // too; a learner group also resets every replica to the average model at each drop (DESIGN.md
  // section 3). Empty: one rate throughout. The rate after the last drop must stay a normal
  // 32-bit float, as learning_rate must.
  std::vector<int64_t> lr_drop_epochs;
  double lr_drop_factor = 0.1;
  double momentum = 0.9;
  double weight_decay = 0.0;
  uint64_t seed = 1;
  int64_t eval_batch = 1000;
  // fit(): besides after each epoch, evaluate the test set every this many training batches
  // (every learner's batches count); 0: after each epoch only.
  int64_t eval_every = 0;
  // fit(): count each epoch's training accuracy (on a device, the probabilities are copied to the
  // host every step for it: about 7% of a replayed MLP step at batch 64 on an H100). false: not
  // counted (EpochReport::train_accuracy -1), as learner groups never count it.
  bool train_accuracy = true;
  bool profile = false;  // time every step of the training plan (Plan::profile_report)
  std::string trace_path;  // non-empty: write a Chrome trace of the training steps there after fit
  // The Executor's policy: "auto" (the performance model grants each op its threads, up to
  // `threads`), "serial", "intra" (every op on `threads`), "fixed" (inter x intra). Empty: run
  // the plan in order, every op with `threads` threads (Plan::run), with no executor at all.
  std::string policy = "auto";
  int inter = 1, intra = 1;
  std::string profile_cache;  // auto: profiles cached in this file ("" for none)
  bool save_profiles = true;  // auto: false loads the cache but never writes it (ExecutorOptions)
  // false: the step graph computes the loss and the gradients but applies no update (synchronous
  // SGD averages several learners' gradients and updates once, outside the graph).
  bool apply_update = true;
  int profile_samples = 5;    // auto: timings per op and thread count
  // auto: try the candidate schedules again after this many seconds of steps on the chosen one
  // (ExecutorOptions::retrial_seconds; 0: never). Benchmarks turn it off so that no timed window
  // holds a trial's serial and narrow stints.
  double retrial_seconds = 10.0;
  // Where the model trains. On a CUDA device the plans queue their kernels in order on one
  // stream of the learner's (policy, threads and the profile cache do not apply there).
  Device device;
  // On a device, replay each plan's run as a captured graph after two eager runs (PlanOptions).
  bool device_graphs = true;
  // CPU: the most bytes a trainer (or a learner group's replicas together) may hold, beyond which
  // it is refused before training (Trainer::memory_bytes); 0: what the machine has available.
  int64_t memory_limit = 0;
};

struct Progress {
  int64_t epoch = 0, epochs = 0;
  // With learners, steps are batches (k a round), and the totals (steps_in_epoch, total_steps)
  // count the batches that rounds of the current k can take: an epoch drops the
  // batches_per_epoch % k no round takes.
  int64_t step = 0, steps_in_epoch = 0;  // step within the epoch, 1-based
  int64_t global_step = 0, total_steps = 0;
  double loss = 0.0;              // mean over the epoch so far
  double samples_per_second = 0.0;
  double eta_seconds = 0.0;
  bool last = false;  // the epoch's (or the run's) last report: a log may want every epoch's end
};

struct EpochReport {
  int64_t epoch = 0;
  int64_t steps = 0;
  double mean_loss = 0.0;
  double train_accuracy = 0.0;
  double test_accuracy = -1.0;  // -1: not evaluated
  double learning_rate = 0.0;   // the rate at the epoch's end (a learner's: with lr scaling, at its count then)
  double seconds = 0.0;
  double samples_per_second = 0.0;
};

// One evaluation of the test set during fit(): after each epoch and, with
// TrainOptions::eval_every, every that many batches.
struct Evaluation {
  int64_t epoch = 0;       // counted from the start of training (a resumed run's go on)
  // Training batches of this fit() so far (every learner's: samples = batches x batch); the
  // eval_every grid counts them too, from this fit()'s first batch.
  int64_t batches = 0;
  double seconds = 0.0;    // training time of this fit() so far; evaluations are not counted
  double test_accuracy = 0.0;
};

// The clock of a fit() loop: training time with the test evaluations (and their callbacks) taken
// out, so samples/s and a tuner's windows do not count them; and the evaluations themselves, after
// each epoch and every `every` batches, each handed to `callback` (returning false asks fit() to
// stop).
class FitClock {
 public:
  // `settle`, when given, runs on the clock before each evaluation: the work still in flight then
  // (learners rounds behind under a staleness bound) is training, and finishes before the time
  // an evaluation reports is read.
  FitClock(int64_t every, std::function<double()> evaluate, std::function<bool(const Evaluation&)> callback,
           std::function<void()> settle = {});
  double training_seconds() const;
  // The time left, `done` of `total` batches trained, at the pace of the run so far in wall time:
  // the evaluations, which training time leaves out, take their share of it.
  double eta_seconds(int64_t done, int64_t total) const;
  // After training batches (before, after] of the run: evaluates once if a multiple of `every`
  // lies in that range. Returns false when the callback asked to stop.
  bool between_batches(int64_t epoch, int64_t before, int64_t after);
  // At the end of an epoch, `batches` into the run: the test accuracy, evaluated unless the last
  // evaluation was at this very batch. `keep_going` becomes false when the callback asked to stop.
  double epoch_end(int64_t epoch, int64_t batches, bool& keep_going);
  // The model moved since the last evaluation without training a batch (a sync period's fold at
  // an epoch's end): epoch_end() evaluates again, even at the batch last evaluated.
  void model_changed() { evaluated_at_ = -1; }
  // Runs `callback` (an epoch's, which may save a checkpoint) off the training clock, as
  // evaluations are; returns what it returns.
  bool off_the_clock(const std::function<bool()>& callback);

 private:
  bool evaluate_at(int64_t epoch, int64_t batches);
  int64_t every_;
  std::function<double()> evaluate_;
  std::function<bool(const Evaluation&)> callback_;
  std::function<void()> settle_;
  std::chrono::steady_clock::time_point start_;
  double off_clock_seconds_ = 0.0;
  int64_t evaluated_at_ = -1;
  double last_accuracy_ = -1.0;
};

// The most epochs one fit() trains (epochs x batches must not overflow a count).
inline constexpr int64_t kMostEpochs = int64_t{1} << 30;

// Held by a running fit() over its object's `running` flag: a fit() called from one of that
// fit()'s own callbacks is refused, since the outer loop would then go on with its own epoch
// numbers, learning rate and data order after the inner one had trained past them.
class FitInProgress {
 public:
  explicit FitInProgress(bool& running) : running_(running) {
    if (running_) throw Error("fit() called from one of its own callbacks, while that fit() runs");
    running_ = true;
  }
  ~FitInProgress() { running_ = false; }
  FitInProgress(const FitInProgress&) = delete;
  FitInProgress& operator=(const FitInProgress&) = delete;

 private:
  bool& running_;
};

struct TrainReport {
  std::vector<EpochReport> epochs;
  int64_t steps = 0;
  double seconds = 0.0;
  double samples_per_second = 0.0;
  double final_loss = 0.0;
  // The trace (TrainOptions::trace_path) could not be written: why (also warned about). fit()
  // does not throw for it, the training it reports being done. Empty when written or not asked.
  std::string trace_error;
};

// Throws unless `data`'s samples fit `model` (`which` names the set in the message): as many values
// as a sample of the model, and for models of images rows x cols as its last two dimensions.
void check_samples_fit(const ModelSpec& model, const Dataset& data, const std::string& which);
// Throws unless every label of `data` names one of the `classes` outputs (logits) of `model`:
// a model narrower than its data's labels is named before training, not at the first batch
// that happens to hold such a label (nor counted as merely wrong by an evaluation).
void check_labels_fit(const ModelSpec& model, int64_t classes, const Dataset& data, const std::string& which);

// What epoch `epoch` (from 1) multiplies the learning rate by under `options`' step decay:
// lr_drop_factor ^ (lr_drop_epochs up to `epoch`).
double learning_rate_factor_at(const TrainOptions& options, int64_t epoch);

// What a memory check may plan on: `available` (available_memory_bytes(), -1 when unknown), or
// `limit` (TrainOptions::memory_limit) where that is set and smaller.
int64_t memory_budget(int64_t available, int64_t limit);

class Trainer {
 public:
  Trainer(ModelSpec model, TrainOptions options);
  ~Trainer();

  // Trains on `train` for TrainOptions::epochs more epochs (or max_steps steps); evaluates on
  // `test` after each epoch when given. A second fit() continues the data order after the epochs
  // trained to their end (one cut short by max_steps or a callback starts again), and numbers its
  // epochs from the start of training. Not from one of its own callbacks (refused).
  TrainReport fit(const Dataset& train, const Dataset* test = nullptr);
  int64_t epochs_done() const { return epochs_done_; }
  // Top-1 accuracy of the current parameters.
  double evaluate(const Dataset& data);
  // One step on a batch given as raw arrays; returns the loss. For tests and benchmarks. Labels
  // outside the model's classes are refused before anything runs (check_batch_labels).
  double train_step(const float* images, const int32_t* labels);
  // The same with the batch's sizes checked: batch x features floats and batch labels.
  double train_step(std::span<const float> images, std::span<const int32_t> labels);
  // The rate the next step trains at: TrainOptions::learning_rate, then where fit() is at in the
  // step decay; set_learning_rate() changes it until fit() next starts an epoch of a schedule
  // (without lr_drop_epochs fit() leaves it as set). Throws on a rate outside a 32-bit float's
  // positive normal range [FLT_MIN, FLT_MAX], which the kernels compute in.
  double learning_rate() const { return learning_rate_; }
  void set_learning_rate(double learning_rate);
  // The parameters from a checkpoint of this model (runtime/checkpoint.h; LearnerGroup::save
  // writes them), verified before anything changes, and the optimizer's state restarted (the
  // momentum, Adam's moments and step count): a warm restart, as LearnerGroup::load's, and the
  // way on after a non-finite loss. Epochs and data order are the caller's (fit() goes on after
  // the epochs this trainer trained).
  void restart_from(const std::string& checkpoint_path);

  void on_progress(std::function<void(const Progress&)> callback) { progress_ = std::move(callback); }
  // Called after each epoch (evaluation included), off the training clock; returning false ends
  // fit() there.
  void on_epoch(std::function<bool(const EpochReport&)> callback) { epoch_done_ = std::move(callback); }
  // Called after every evaluation of the test set in fit(); returning false ends fit() there.
  void on_evaluation(std::function<bool(const Evaluation&)> callback) { evaluated_ = std::move(callback); }
  ParamStore& params() { return *store_; }
  const ParamStore& params() const { return *store_; }
  const Graph& train_graph() const { return train_graph_; }
  Plan& train_plan() { return *train_plan_; }
  const Plan& train_plan() const { return *train_plan_; }
  const TrainOptions& options() const { return options_; }
  // The model's number of classes: the width of its logits.
  int64_t classes() const { return train_graph_.value(logits_.id).shape[1]; }
  // Throws unless each of a training batch's labels (batch of them, on the host) is one of the
  // classes. The CPU kernel refuses such a label itself, but the CUDA kernel can only write a NaN
  // loss, and the same step's update would have spread it through the weights.
  void check_batch_labels(const int32_t* labels) const;
  // Bytes this trainer holds: parameters, gradients and optimizer state, both plans' inputs and
  // activations, what their kernels allocated for themselves, and on a device the stream's
  // workspace (workspace_bytes) and its own buffers (ExecContext::resident_bytes). An estimate from what was allocated, touched or not (a plan's
  // pages are touched when it first runs; the workspace is allocated then).
  int64_t memory_bytes() const;
  // The host's batches fit() holds besides: its Batcher's (batcher_bytes) and the one the step
  // trains on. The memory check when the trainer is made counts both. (LearnerGroup's replicas
  // are fed by the group's own feeder, which the group's check counts.)
  int64_t fed_bytes() const;
  // The workspace the trainer's stream grows to when its plans run: both plans share the stream,
  // so the larger of their largest requests (Plan::workspace_bytes; 0 on the CPU).
  int64_t workspace_bytes() const;
  // The executor running the training plan; nullptr when the policy is empty (Plan::run) and on a
  // CUDA device, where the plan's kernels are queued on the stream instead.
  const Executor* executor() const { return executor_.get(); }
  // Before the first step: the executor starts from `tuning` (Executor::adopt). False, changing
  // nothing, without an executor or where the tuning is another plan's or thread count's.
  bool adopt_tuning(const ExecutorTuning& tuning) { return executor_ && executor_->adopt(tuning); }
  // Steps taken, failed ones included (Adam's bias correction counts them, as do error messages).
  // A replica that takes over another's optimizer state takes over its count too (a resize).
  int64_t steps_done() const { return steps_done_; }
  void continue_steps_from(int64_t steps) { steps_done_ = steps; }

 private:
  Graph build_graph(int64_t batch, bool training, Value* logits, Value* loss, Value* probs);
  // Flat buffers a parameter has: itself, its gradient and the optimizer's state (momentum, or
  // Adam's two moments).
  int64_t buffers_per_parameter() const { return options_.optimizer == "adam" ? 4 : 3; }
  // From the training graph's shapes: the parameters, their gradients and the optimizer's state.
  int64_t parameter_bytes() const;
  // What is touched before the plans exist: parameter_bytes(), both graphs' inputs and fed_bytes().
  int64_t shape_bytes() const;
  // Refuses `need` bytes (an `estimate`: "at least", "about") beyond the budget from `available`.
  void check_fits(int64_t available, int64_t need, const char* estimate) const;
  // `tensor`'s values on the host: its own memory on the CPU, else a copy into `buffer`.
  const float* on_host(const Plan& plan, const Tensor& tensor, std::vector<float>& buffer) const;

  ModelSpec model_;
  TrainOptions options_;
  Graph train_graph_, eval_graph_;
  Value logits_, loss_, probs_, eval_logits_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<Plan> train_plan_, eval_plan_;
  std::unique_ptr<Trace> trace_;
  std::unique_ptr<Executor> executor_;
  // The training plan's inputs, looked up once rather than by name every step.
  Tensor images_in_, labels_in_, learning_rate_in_, step_in_;
  double learning_rate_;
  int64_t steps_done_ = 0;
  int64_t epochs_done_ = 0;  // epochs fit() trained to their end: the next fit() goes on after them
  bool fitting_ = false;     // a fit() is running (FitInProgress)
  std::vector<float> host_buffer_;
  std::function<void(const Progress&)> progress_;
  std::function<bool(const EpochReport&)> epoch_done_;
  std::function<bool(const Evaluation&)> evaluated_;
};

}  // namespace quiver
