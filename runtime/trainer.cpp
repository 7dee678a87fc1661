#include "runtime/trainer.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/autodiff.h"
#include "core/error.h"
#include "runtime/batcher.h"
#include "runtime/checkpoint.h"

namespace quiver {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t count_correct(const float* scores, const int32_t* labels, int64_t rows, int64_t classes) {
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = scores + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (row[c] > row[best]) best = c;
    correct += best == labels[r];
  }
  return correct;
}

// The kernels compute in 32-bit floats: a rate past their range is infinite there (a learning
// rate scaled by a learner count, too), and a decay below their normal range is flushed to 0.
void check_learning_rate(double learning_rate) {
  if (!(learning_rate > 0.0) || !std::isfinite(learning_rate))
    throw Error(cat("learning rate must be a positive number, got ", learning_rate));
  if (learning_rate > std::numeric_limits<float>::max())
    throw Error(cat("learning rate ", learning_rate, " is beyond the largest 32-bit float, which training computes in"));
  if (learning_rate < std::numeric_limits<float>::min())  // flushed to 0: training would not move
    throw Error(cat("learning rate ", learning_rate, " is below the smallest normal 32-bit float (",
                    std::numeric_limits<float>::min(), "), which training computes in"));
}

void check_options(const TrainOptions& o) {
  if (o.batch < 1) throw Error(cat("batch must be >= 1, got ", o.batch));
  if (o.epochs < 1 || o.epochs > kMostEpochs) throw Error(cat("epochs must be in 1..", kMostEpochs, ", got ", o.epochs));
  if (o.max_steps < 0) throw Error(cat("max_steps must be >= 0, got ", o.max_steps));
  if (o.threads < 1 || o.threads > PerfModel::kMostThreads)
    throw Error(cat("threads must be in 1..", PerfModel::kMostThreads, ", got ", o.threads));
  check_learning_rate(o.learning_rate);
  if (!(o.weight_decay == 0.0 || (o.weight_decay >= std::numeric_limits<float>::min() &&
                                  o.weight_decay <= std::numeric_limits<float>::max())))
    throw Error(cat("weight decay must be 0 or in a 32-bit float's normal range [",
                    std::numeric_limits<float>::min(), ", ", std::numeric_limits<float>::max(), "], got ",
                    o.weight_decay));
  if (o.optimizer != "sgd" && o.optimizer != "adam")
    throw Error(cat("optimizer must be sgd or adam, got '", o.optimizer, "'"));
  if (o.eval_batch < 1) throw Error(cat("eval batch must be >= 1, got ", o.eval_batch));
  if (o.eval_every < 0) throw Error(cat("eval every must be >= 0 batches, got ", o.eval_every));
  if (o.memory_limit < 0) throw Error(cat("memory limit must be >= 0 bytes (0: none), got ", o.memory_limit));
  for (size_t i = 0; i < o.lr_drop_epochs.size(); ++i) {
    const int64_t epoch = o.lr_drop_epochs[i];
    if (epoch < 2)
      throw Error(cat("learning-rate drops: epoch ", epoch, " is not a drop (epochs count from 1; the first trains at ",
                      "the learning rate itself)"));
    if (i > 0 && epoch <= o.lr_drop_epochs[i - 1])
      throw Error(cat("learning-rate drops: epochs must rise, got ", o.lr_drop_epochs[i - 1], " then ", epoch));
  }
  if (!(o.lr_drop_factor > 0.0 && o.lr_drop_factor <= 1.0))
    throw Error(cat("learning-rate drop factor must be in (0, 1], got ", o.lr_drop_factor));
  // The rate after the last drop is one the kernels can still take (a subnormal one is flushed to
  // 0 there: those epochs would train nothing).
  if (const double lowest = o.learning_rate * std::pow(o.lr_drop_factor, static_cast<double>(o.lr_drop_epochs.size()));
      !o.lr_drop_epochs.empty() && lowest < std::numeric_limits<float>::min())
    throw Error(cat("learning-rate drops: ", o.lr_drop_epochs.size(), " drop(s) of ", o.lr_drop_factor,
                    " take the learning rate to ", lowest, ", below the smallest normal 32-bit float (",
                    std::numeric_limits<float>::min(), ")"));
}

}  // namespace

double learning_rate_factor_at(const TrainOptions& options, int64_t epoch) {
  double factor = 1.0;
  for (int64_t drop : options.lr_drop_epochs)
    if (drop <= epoch) factor *= options.lr_drop_factor;
  return factor;
}

FitClock::FitClock(int64_t every, std::function<double()> evaluate, std::function<bool(const Evaluation&)> callback,
                   std::function<void()> settle)
    : every_(every),
      evaluate_(std::move(evaluate)),
      callback_(std::move(callback)),
      settle_(std::move(settle)),
      start_(Clock::now()) {}

double FitClock::training_seconds() const { return seconds_since(start_) - off_clock_seconds_; }

double FitClock::eta_seconds(int64_t done, int64_t total) const {
  return seconds_since(start_) / static_cast<double>(std::max<int64_t>(1, done)) *
         static_cast<double>(std::max<int64_t>(0, total - done));
}

bool FitClock::evaluate_at(int64_t epoch, int64_t batches) {
  if (settle_) settle_();
  const double trained = training_seconds();
  return off_the_clock([&] {  // neither the evaluation nor its callback is training
    last_accuracy_ = evaluate_();
    evaluated_at_ = batches;
    return !callback_ || callback_(Evaluation{epoch, batches, trained, last_accuracy_});
  });
}

bool FitClock::between_batches(int64_t epoch, int64_t before, int64_t after) {
  if (every_ <= 0 || after / every_ == before / every_) return true;
  return evaluate_at(epoch, after);
}

bool FitClock::off_the_clock(const std::function<bool()>& callback) {
  const Clock::time_point begin = Clock::now();
  const bool result = callback();
  off_clock_seconds_ += seconds_since(begin);
  return result;
}

double FitClock::epoch_end(int64_t epoch, int64_t batches, bool& keep_going) {
  if (evaluated_at_ != batches) keep_going = evaluate_at(epoch, batches) && keep_going;
  return last_accuracy_;
}

Trainer::Trainer(ModelSpec model, TrainOptions options)
    : model_(std::move(model)), options_(std::move(options)), learning_rate_(options_.learning_rate) {
  check_options(options_);
  if (!model_.build) throw Error(cat("model '", model_.name, "' has no build function"));
  // Read before anything is allocated: memory_bytes() counts what this trainer touches as it is
  // built (inputs, the LSTM's scratch), which MemAvailable would otherwise count as taken twice.
  const int64_t available = options_.device.is_cpu() ? available_memory_bytes() : -1;
  train_graph_ = build_graph(options_.batch, true, &logits_, &loss_, &probs_);
  eval_graph_ = build_graph(options_.eval_batch, false, &eval_logits_, nullptr, nullptr);
  // A first check from the graphs' shapes, before anything is allocated: the parameters, their
  // gradients, the optimizer's state and both graphs' inputs are zeroed (touched) as they are
  // made, so a model whose share of them alone does not fit would meet the out-of-memory killer
  // before the full estimate below.
  if (options_.device.is_cpu()) check_fits(available, shape_bytes(), "at least");
  store_ = std::make_unique<ParamStore>(train_graph_, options_.device);
  store_->initialize(options_.seed);
  PlanOptions plan_options;
  plan_options.threads = options_.threads;
  plan_options.profile = options_.profile;
  plan_options.device = options_.device;
  plan_options.device_graphs = options_.device_graphs;
  std::vector<Value> fetches{loss_, probs_};
  if (!options_.apply_update)  // nothing in-place needs the gradients: fetch them
    for (const ValueInfo& info : train_graph_.values())
      if (info.role == ValueRole::ParamGrad && info.producer >= 0) fetches.push_back(train_graph_.handle(info.id));
  train_plan_ = std::make_unique<Plan>(train_graph_, *store_, fetches, plan_options);
  plan_options.stream = train_plan_->shared_context();  // one learner, one stream: a device's plans stay ordered
  eval_plan_ = std::make_unique<Plan>(eval_graph_, *store_, std::vector<Value>{eval_logits_}, plan_options);
  images_in_ = train_plan_->input("images");
  labels_in_ = train_plan_->input("labels");
  if (train_plan_->has_input("learning_rate")) learning_rate_in_ = train_plan_->input("learning_rate");
  if (train_plan_->has_input("step")) step_in_ = train_plan_->input("step");
  if (!options_.policy.empty() && options_.device.is_cpu()) {
    ExecutorOptions executor;
    executor.policy = parse_policy(options_.policy);
    executor.threads = options_.threads;
    executor.inter = options_.inter;
    executor.intra = options_.intra;
    executor.profile_cache = options_.profile_cache;
    executor.profile_samples = options_.profile_samples;
    executor.retrial_seconds = options_.retrial_seconds;
    executor.save_profiles = options_.save_profiles;
    executor_ = std::make_unique<Executor>(*train_plan_, executor);
  }
  if (!options_.trace_path.empty()) {
    trace_ = std::make_unique<Trace>();
    train_plan_->set_trace(trace_.get());
  }
  // Refused now rather than by the kernel's out-of-memory killer once the plans' pages are touched.
  if (options_.device.is_cpu()) check_fits(available, memory_bytes() + fed_bytes(), "about");
}

int64_t Trainer::parameter_bytes() const {
  int64_t count = 0;  // what ParamStore allocates: one slot a parameter (a tied value shares it)
  for (const ParamInfo& param : train_graph_.params()) count += train_graph_.value(param.value).shape.numel();
  return buffers_per_parameter() * count * static_cast<int64_t>(sizeof(float));
}

int64_t Trainer::shape_bytes() const {
  int64_t bytes = parameter_bytes() + fed_bytes();
  for (const Graph* graph : {&train_graph_, &eval_graph_})
    for (const ValueInfo& info : graph->values())
      if (info.role == ValueRole::Input) bytes += info.shape.numel() * size_of(info.dtype);
  return bytes;
}

void Trainer::check_fits(int64_t available, int64_t need, const char* estimate) const {
  const int64_t have = memory_budget(available, options_.memory_limit);
  if (have <= 0 || need <= have) return;
  // What would make it fit: the batch, unless the parameters with their gradients and the
  // optimizer's state are most of it.
  const int64_t parameters = parameter_bytes();
  const std::string advice =
      2 * parameters > need ? cat("its parameters, their gradients and the optimizer's state alone take ",
                                  parameters >> 20, " MiB")
                            : std::string("a smaller batch");
  throw Error(cat("model '", model_.name, "' at batch ", options_.batch, " needs ", estimate, " ", need >> 20,
                  " MiB of memory, only ", have >> 20, " MiB are ",
                  have == options_.memory_limit ? "allowed (memory limit)" : "available", " (", advice, ")"));
}

Trainer::~Trainer() = default;

int64_t Trainer::memory_bytes() const {
  int64_t bytes = buffers_per_parameter() * store_->flat_size() * static_cast<int64_t>(sizeof(float));
  for (const Plan* plan : {train_plan_.get(), eval_plan_.get()})
    bytes += plan->input_bytes() + plan->activation_bytes() + plan->kernel_bytes();
  // Both plans share one context (one stream on a device): its own buffers count once.
  return bytes + workspace_bytes() + train_plan_->context().resident_bytes();
}

int64_t Trainer::fed_bytes() const {
  BatcherOptions feeder;  // as fit() makes them: the default depth
  feeder.batch_size = options_.batch;
  const int64_t features = model_.sample_shape.numel();
  return batcher_bytes(feeder, features) + batch_bytes(options_.batch, features);  // and the step's own
}

int64_t Trainer::workspace_bytes() const {
  return std::max(train_plan_->workspace_bytes(), eval_plan_->workspace_bytes());
}

void Trainer::restart_from(const std::string& checkpoint_path) {
  const Tensor& params = store_->flat_params();
  Tensor scratch = Tensor::zeros(params.shape(), DType::F32);  // a bad file leaves the model as it was
  load_checkpoint(checkpoint_path, *store_, scratch, model_.name);
  train_plan_->synchronize();  // a device's queued steps have finished with the buffers
  params.copy_from(scratch);
  for (const std::string& kind : store_->state_kinds()) {
    const Tensor& state = store_->flat_state(kind);
    state.copy_from(Tensor::zeros(state.shape(), DType::F32));
  }
  steps_done_ = 0;  // Adam's bias correction starts again with its moments
}

Graph Trainer::build_graph(int64_t batch, bool training, Value* logits, Value* loss, Value* probs) {
  GraphBuilder builder;
  std::vector<int64_t> dims{batch};
  for (int64_t extent : model_.sample_shape.dims()) dims.push_back(extent);
  Value images = builder.input("images", Shape(dims));
  *logits = model_.build(builder, images);
  if (!logits->valid()) throw Error(cat("model '", model_.name, "': its build function returned no value (a default Value)"));
  // The trainer feeds "images", and adds "labels", "learning_rate" and "step" itself.
  for (const ValueInfo& info : builder.graph().values())
    if (info.role == ValueRole::Input && info.name != "images")
      throw Error(cat("model '", model_.name, "' declares input '", info.name,
                      "': the trainer feeds 'images' only (and adds 'labels', 'learning_rate' and 'step' itself)"));
  for (const char* name : {"labels", "learning_rate", "step"})
    if (builder.graph().has_name(name))
      throw Error(cat("model '", model_.name, "' names a value '", name,
                      "': the trainer keeps that name for an input of its own (rename the value)"));
  const Graph& graph = builder.graph();
  const Shape out = graph.value(graph.id_of(*logits, cat("model '", model_.name, "': the value its build function returned"))).shape;
  if (out.rank() != 2 || out[0] != batch)
    throw Error(cat("model '", model_.name, "' returned logits of shape ", out.str(),
                    "; expected (", batch, ", classes)"));
  if (!training) return std::move(builder.graph());
  Value labels = builder.input("labels", Shape{batch}, DType::I32);
  std::vector<Value> loss_outputs = builder.apply("softmax_cross_entropy", {*logits, labels}, {}, "loss");
  *loss = loss_outputs[0];
  *probs = loss_outputs[1];
  build_backward(builder, *loss);
  if (!options_.apply_update) return std::move(builder.graph());
  Value learning_rate = builder.input("learning_rate", Shape{1});
  if (options_.optimizer == "adam") {
    Value step = builder.input("step", Shape{1});
    AdamOptions adam;
    adam.weight_decay = options_.weight_decay;
    add_adam_update(builder, learning_rate, step, adam);
  } else {
    add_sgd_update(builder, learning_rate, SgdOptions{options_.momentum, options_.weight_decay});
  }
  return std::move(builder.graph());
}

double Trainer::train_step(std::span<const float> images, std::span<const int32_t> labels) {
  if (static_cast<int64_t>(images.size()) != images_in_.numel() || static_cast<int64_t>(labels.size()) != labels_in_.numel())
    throw Error(cat("train step: a batch of ", options_.batch, " needs ", images_in_.numel(), " image values and ",
                    labels_in_.numel(), " labels, got ", images.size(), " and ", labels.size()));
  return train_step(images.data(), labels.data());
}

void Trainer::check_batch_labels(const int32_t* labels) const {
  if (labels == nullptr) throw Error("train step: no labels (a null pointer)");
  const int64_t classes = this->classes();
  for (int64_t row = 0; row < labels_in_.numel(); ++row)
    if (labels[row] < 0 || labels[row] >= classes)
      throw Error(cat("train step: label ", labels[row], " at row ", row, " of the batch is outside 0..", classes - 1,
                      " (model '", model_.name, "' has ", classes, " classes); nothing was trained"));
}

double Trainer::train_step(const float* images, const int32_t* labels) {
  const Plan& plan = *train_plan_;
  check_batch_labels(labels);  // on the host, before anything of this batch reaches the plan
  plan.upload(images_in_, images);
  plan.upload(labels_in_, labels);
  const float learning_rate = static_cast<float>(learning_rate_);
  if (learning_rate_in_.defined()) plan.upload(learning_rate_in_, &learning_rate);
  ++steps_done_;
  const float step = static_cast<float>(steps_done_);
  if (step_in_.defined()) plan.upload(step_in_, &step);
  if (executor_)
    executor_->run();
  else
    train_plan_->run();
  float loss_value = 0.0f;
  plan.download(&loss_value, train_plan_->tensor(loss_));
  double loss = loss_value;
  if (!std::isfinite(loss))
    throw Error(cat("training stopped: loss is ", loss, " at step ", steps_done_,
                    " (try a lower learning rate)"));
  return loss;
}

void Trainer::set_learning_rate(double learning_rate) {
  check_learning_rate(learning_rate);
  learning_rate_ = learning_rate;
}

int64_t memory_budget(int64_t available, int64_t limit) {
  if (limit > 0 && (available <= 0 || limit < available)) return limit;
  return available;
}

void check_samples_fit(const ModelSpec& model, const Dataset& data, const std::string& which) {
  if (data.count < 1) throw Error(cat("the ", which, " is empty"));
  const Shape& shape = model.sample_shape;
  // A model of images (the CNN's 1x28x28, the LSTM's 28 steps of 28) takes rows x cols as they
  // are; 14x56 has the values of 28x28 but not its geometry. Others take the values in a row.
  const bool image = shape.rank() >= 2;
  int64_t features = 0;  // extents that overflow fit nothing (evaluate() checks this before consistency)
  const bool fits = !__builtin_mul_overflow(data.rows, data.cols, &features) && features == shape.numel() &&
                    (!image || (data.rows == shape[shape.rank() - 2] && data.cols == shape[shape.rank() - 1]));
  if (!fits)
    throw Error(cat("model '", model.name, "' takes samples of ", shape.str(), ", the ", which, " has samples of ",
                    data.rows, "x", data.cols));
}

void check_labels_fit(const ModelSpec& model, int64_t classes, const Dataset& data, const std::string& which) {
  const int64_t count = std::min<int64_t>(data.count, static_cast<int64_t>(data.labels.size()));
  for (int64_t i = 0; i < count; ++i)
    if (data.labels[i] < 0 || data.labels[i] >= classes)
      throw Error(cat("the ", which, "'s sample ", i, " has label ", data.labels[i], "; model '", model.name,
                      "' has ", classes, " classes (logits of width ", classes, "), labels 0..", classes - 1));
}

TrainReport Trainer::fit(const Dataset& train, const Dataset* test) {
  const FitInProgress running(fitting_);
  // Both sets, before the first step: a test set that does not fit would otherwise be found
  // after the first epoch of training.
  check_consistent(train, "training set");
  check_samples_fit(model_, train, "training set");
  check_labels_fit(model_, classes(), train, "training set");
  if (test) check_consistent(*test, "test set");
  if (test) check_samples_fit(model_, *test, "test set");
  if (test) check_labels_fit(model_, classes(), *test, "test set");
  BatcherOptions batcher_options;
  batcher_options.batch_size = options_.batch;
  batcher_options.seed = options_.seed;
  batcher_options.first_epoch = epochs_done_;  // a second fit() continues the data order
  Batcher batcher(train, batcher_options);
  const int64_t per_epoch = batcher.batches_per_epoch();
  int64_t total = per_epoch * options_.epochs;
  if (options_.max_steps > 0) total = std::min(total, options_.max_steps);
  const int64_t classes = train_plan_->tensor(probs_).shape()[1];

  TrainReport report;
  FitClock clock(test ? options_.eval_every : 0, [&] { return evaluate(*test); }, evaluated_);
  const TraceOnError trace_on_error(trace_.get(), options_.trace_path);
  int64_t global = 0;
  bool keep_going = true;
  const int64_t epochs_before = epochs_done_;  // epochs are numbered from the start of training
  for (int64_t epoch = 1; epoch <= options_.epochs && global < total && keep_going; ++epoch) {
    const int64_t number = epochs_before + epoch;
    if (!options_.lr_drop_epochs.empty())
      learning_rate_ = options_.learning_rate * learning_rate_factor_at(options_, number);
    EpochReport epoch_report;
    epoch_report.epoch = number;
    const double epoch_start = clock.training_seconds();
    double loss_sum = 0.0;
    int64_t correct = 0;
    Clock::time_point last_report = Clock::now();
    for (int64_t step = 1; step <= per_epoch && global < total && keep_going; ++step) {
      Batch batch = batcher.next();
      double loss = train_step(batch.images.data(), batch.labels.data());
      ++global;
      loss_sum += loss;
      if (options_.train_accuracy)
        correct += count_correct(on_host(*train_plan_, train_plan_->tensor(probs_), host_buffer_),
                                 batch.labels.data(), batch.size, classes);
      epoch_report.steps = step;
      bool last = step == per_epoch || global == total;
      if (progress_ && (last || seconds_since(last_report) > 0.5)) {
        last_report = Clock::now();
        double elapsed = clock.training_seconds();
        Progress p{number, epochs_before + options_.epochs, step, per_epoch, global, total, loss_sum / step,
                   global * options_.batch / std::max(elapsed, 1e-9),
                   clock.eta_seconds(global, total), last};
        progress_(p);
      }
      if (!last) keep_going = clock.between_batches(number, global - 1, global);
    }
    epoch_report.seconds = clock.training_seconds() - epoch_start;
    epoch_report.learning_rate = learning_rate_;
    epoch_report.mean_loss = loss_sum / std::max<int64_t>(1, epoch_report.steps);
    epoch_report.train_accuracy =
        options_.train_accuracy ? static_cast<double>(correct) / std::max<int64_t>(1, epoch_report.steps * options_.batch)
                                : -1.0;
    epoch_report.samples_per_second = epoch_report.steps * options_.batch / std::max(epoch_report.seconds, 1e-9);
    report.final_loss = epoch_report.mean_loss;
    // Counted before the epoch's evaluation, whose callback sees the epoch finished (a cut one
    // starts again at the next fit()).
    if (epoch_report.steps == per_epoch) ++epochs_done_;
    if (test) epoch_report.test_accuracy = clock.epoch_end(number, global, keep_going);
    report.epochs.push_back(epoch_report);
    if (epoch_done_ && !clock.off_the_clock([&] { return epoch_done_(epoch_report); })) break;
  }
  report.steps = global;
  report.seconds = 0.0;
  for (const EpochReport& e : report.epochs) report.seconds += e.seconds;
  report.samples_per_second = global * options_.batch / std::max(report.seconds, 1e-9);
  if (trace_) report.trace_error = trace_->write_after_training(options_.trace_path);
  return report;
}

const float* Trainer::on_host(const Plan& plan, const Tensor& tensor, std::vector<float>& buffer) const {
  if (tensor.device().is_cpu()) return tensor.f32();
  buffer.resize(static_cast<size_t>(tensor.numel()));
  plan.download(buffer.data(), tensor);
  return buffer.data();
}

double Trainer::evaluate(const Dataset& data) {
  Plan& plan = *eval_plan_;
  const Tensor& images = plan.input("images");
  const int64_t batch = images.shape()[0];
  const int64_t features = images.numel() / batch;
  check_samples_fit(model_, data, "evaluation set");
  check_consistent(data, "evaluate");
  check_labels_fit(model_, classes(), data, "evaluation set");
  const Tensor& logits = plan.tensor(eval_logits_);
  const int64_t classes = logits.shape()[1];
  int64_t correct = 0;
  std::vector<float> padded;  // the last, partial batch, zero-filled
  std::vector<float> host_logits;
  for (int64_t first = 0; first < data.count; first += batch) {
    int64_t rows = std::min(batch, data.count - first);
    const float* source = data.images.data() + first * features;
    if (rows < batch) {
      padded.assign(static_cast<size_t>(batch * features), 0.0f);
      std::copy_n(source, rows * features, padded.data());
      source = padded.data();
    }
    plan.upload(images, source);
    plan.run();
    correct += count_correct(on_host(plan, logits, host_logits), data.labels.data() + first, rows, classes);
  }
  return static_cast<double>(correct) / static_cast<double>(data.count);
}

}  // namespace quiver
