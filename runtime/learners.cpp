#include "runtime/learners.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/batcher.h"
#include "ops/optimizer.h"

namespace quiver {

LrScaling parse_lr_scaling(const std::string& name) {
  if (name == "none") return LrScaling::None;
  if (name == "linear") return LrScaling::Linear;
  if (name == "sqrt") return LrScaling::Sqrt;
  throw Error(cat("expected none, linear or sqrt, got '", name, "'"));
}

double lr_scale(LrScaling rule, int learners) {
  switch (rule) {
    case LrScaling::Linear: return learners;
    case LrScaling::Sqrt: return std::sqrt(static_cast<double>(learners));
    case LrScaling::None: break;
  }
  return 1.0;
}

namespace {

// Learner j's step in round `round`; a quiver::Error from it is said again naming both (the step
// a trainer's own message names counts that learner's steps).
template <typename Step>
double with_learner_named(size_t j, int64_t round, Step&& step) {
  try {
    return step();
  } catch (const Error& error) {
    throw Error(cat("learner ", j, ", round ", round, ": ", error.what()));
  }
}

}  // namespace

int LearnerGroup::prefetch_depth() const {
  // Four rounds of the largest group ahead, so a round never waits on I/O, but at most ~64 MiB of
  // batches (a 64-core host at batch 1024 would otherwise queue gigabytes) and at least two rounds.
  const int64_t by_memory = (int64_t{64} << 20) / std::max<int64_t>(1, batch_bytes());
  const int64_t most = std::max(options_.learners, options_.max_learners);  // an explicit k may exceed the tuner's
  return static_cast<int>(std::max<int64_t>(2 * most, std::min<int64_t>(4 * most, by_memory)));
}

int64_t learner_bytes(const Trainer& replica, bool snapshot) {
  return replica.memory_bytes() + (snapshot ? replica.params().flat_size() * 4 : 0);
}

LearnerGroup::LearnerGroup(ModelSpec model, TrainOptions train, LearnerOptions options)
    : model_(std::move(model)), train_(std::move(train)), options_(options) {
  if (options.learners < 1) throw Error(cat("learners: need at least 1, got ", options.learners));
  if (options.threads_per_learner < 1)
    throw Error(cat("threads per learner: need at least 1, got ", options.threads_per_learner));
  if (!(options.tune_threshold > 0.0)) throw Error(cat("tune threshold must be > 0, got ", options.tune_threshold));
  if (!(options.tune_confirm_band >= 0.0))
    throw Error(cat("tune confirm band must be >= 0, got ", options.tune_confirm_band));
  if (options.tune_window < 1) throw Error(cat("tune window must be >= 1 round, got ", options.tune_window));
  // Infinite would never end a window: the tuner would not settle.
  if (!(options.tune_window_seconds >= 0.0 && std::isfinite(options.tune_window_seconds)))
    throw Error(cat("tune window must be finite and >= 0 seconds, got ", options.tune_window_seconds));
  if (!(options.tune_warmup_seconds >= 0.0 && std::isfinite(options.tune_warmup_seconds)))
    throw Error(cat("tune warm-up must be finite and >= 0 seconds, got ", options.tune_warmup_seconds));
  if (options.tune_cores < 0) throw Error(cat("tune cores must be >= 0 (0: all), got ", options.tune_cores));
  if (!(options.tune_cut_below >= 0.0 && options.tune_cut_below < 1.0))
    throw Error(cat("tune cut below must be in [0, 1), got ", options.tune_cut_below));
  // Default ceiling: on the CPU one learner per core of the tuner's budget (more would run learner
  // threads on shared cores, which DESIGN.md calls a bug); 8 streams per GPU (Crossbow's range) on CUDA.
  const int tune_cores = options.tune_cores > 0 ? options.tune_cores : available_cores();
  if (options.max_learners == 0)
    options_.max_learners = train_.device.is_cpu() ? tune_cores : 8 * std::max(1, options.devices);
  if (options_.max_learners < 1) throw Error(cat("max learners must be >= 1, got ", options.max_learners));
  // An explicit ceiling above the tuner's cores would have it try learners that share cores.
  if (options.tune && train_.device.is_cpu() && options_.max_learners > tune_cores)
    throw Error(cat("max learners ", options_.max_learners, " is more than the ", tune_cores,
                    " cores the tuner splits: CPU learners need a core each (lower max learners, or raise tune cores)"));
  batch_ = train_.batch;
  features_ = model_.sample_shape.numel();
  if (options.sync == Sync::Ssgd && !train_.device.is_cpu())
    throw Error(cat("synchronous SGD runs on the CPU only; use --sync sma on ", train_.device.str()));
  if (options.sync == Sync::Ssgd && train_.optimizer != "sgd")
    throw Error(cat("synchronous SGD applies momentum SGD; optimizer '", train_.optimizer, "' is not supported with it"));
  if (options.staleness < 0 || options.staleness > kMaxStaleness)
    throw Error(cat("staleness: must be in [0, ", kMaxStaleness, "] rounds, got ", options.staleness));
  if (options.staleness > 0) {
    if (options.sync == Sync::Ssgd)
      throw Error("staleness: synchronous SGD averages every round's gradients; a staleness bound needs --sync sma");
    if (!train_.device.is_cpu())
      throw Error(cat("staleness: a staleness bound runs on CPU learners only for now, not on ", train_.device.str()));
  }
  if (options.sync_period < 1 || options.sync_period > kMaxSyncPeriod)
    throw Error(cat("sync period: must be in [1, ", kMaxSyncPeriod, "] rounds, got ", options.sync_period));
  if (options.sync_period > 1 && options.sync == Sync::Ssgd)
    throw Error("sync period: synchronous SGD averages every round's gradients; a sync period needs --sync sma");
  if (options.sync_period > 1 && options.staleness > 0)
    throw Error("sync period: a staleness bound absorbs every learner's correction each round; use one or the other");
  TrainOptions average = train_;
  average.policy = "";  // evaluation only: no executor
  // z is evaluated while the learners wait: on the group's cores, not one learner's share.
  const int group_threads = options.tune ? tune_cores : options.learners * options.threads_per_learner;
  average.threads = std::max(1, std::min(group_threads, available_cores()));
  average.trace_path.clear();  // the group traces every learner into one file (trace_)
  if (!train_.trace_path.empty()) trace_ = std::make_unique<Trace>();
  if (options.devices < 1) throw Error(cat("devices: need at least 1, got ", options.devices));
  if (train_.device.is_cpu() && options.devices != 1)
    throw Error(cat("devices: ", options.devices, " devices asked for, but the learners are on the CPU"));
  // A device's SMA round takes at most kMaxLearnersPerDevice replicas: refuse more up front.
  const int most = std::max(options.learners, options.tune ? options_.max_learners : 0);
  if (!train_.device.is_cpu() && (most + options.devices - 1) / options.devices > kMaxLearnersPerDevice)
    throw Error(cat("learners: ", most, " learner(s) over ", options.devices, " GPU(s) is more than ",
                    kMaxLearnersPerDevice, " per GPU, the most one GPU's SMA round takes"));
  // The rate the largest group trains at must fit the kernels' 32-bit floats: refused now, not by
  // a tuner's resize (which takes a refusal for a group too large for memory and settles).
  if (const double largest = train_.learning_rate * lr_scale(options.lr_scaling, most);
      largest > std::numeric_limits<float>::max())
    throw Error(cat("learning rate: ", train_.learning_rate, " scaled for ", most, " learners is ", largest,
                    ", beyond the largest 32-bit float, which training computes in"));
  for (int d = 0; d < options.devices; ++d) {
    devices_.push_back(Device{train_.device.kind, train_.device.index + d});
    if (!train_.device.is_cpu()) backend_for(devices_.back());  // throws for a device that does not exist
  }
  average_ = std::make_unique<Trainer>(model_, average);
  build(options.learners, options.threads_per_learner);
}

void LearnerGroup::build(int learners, int threads_per_learner, bool carry_state) {
  settle();
  if (!learners_.empty()) {
    refresh_average();
    if (const Executor* executor = learners_.front()->trainer->executor())
      if (std::optional<ExecutorTuning> tuning = executor->tuning())
        tunings_[{this->learners(), threads_per_learner_}] = std::move(*tuning);
  }
  if (learners < 1 || threads_per_learner < 1)
    throw Error(cat("learners: need at least 1 learner of 1 thread, got ", learners, " x ", threads_per_learner));
  if (learners < static_cast<int>(devices_.size()))
    throw Error(cat("learners: ", learners, " learner(s) cannot cover ", devices_.size(), " devices"));
  TrainOptions replica = train_;
  replica.threads = threads_per_learner;
  replica.learning_rate = learner_learning_rate(learners, lr_factor_);
  replica.lr_drop_epochs.clear();  // the group follows the step decay (set_learning_rate_factor)
  replica.apply_update = options_.sync == Sync::Sma;
  replica.eval_batch = 1;  // learners never evaluate; keep their evaluation plans small
  replica.trace_path.clear();
  // Learners beside other learners time their ops under the others' load: they read the profile
  // cache but leave it as single-stream runs wrote it.
  replica.save_profiles = train_.save_profiles && learners == 1;
  std::vector<std::unique_ptr<Learner>> built;
  const int per_device = (learners + static_cast<int>(devices_.size()) - 1) / static_cast<int>(devices_.size());
  // On the CPU, read before the first replica is built: each replica counts whole below, what it
  // touches while being built included (its inputs, the LSTM's scratch).
  const int64_t cpu_available = train_.device.is_cpu() ? memory_budget(available_memory_bytes(), train_.memory_limit) : -1;
  for (int j = 0; j < learners; ++j) {
    auto learner = std::make_unique<Learner>();
    if (j > 0) learner->stream = std::make_unique<CpuStream>();
    replica.device = devices_[j % devices_.size()];
    learner->trainer = std::make_unique<Trainer>(model_, replica);
    if (auto known = tunings_.find({learners, threads_per_learner}); known != tunings_.end())
      learner->trainer->adopt_tuning(known->second);
    if (trace_) learner->trainer->train_plan().set_trace(trace_.get(), j, rounds_done_ + 1);  // steps = rounds
    if (j < static_cast<int>(devices_.size())) {
      // The first replica on a device exists already. On the CPU all replicas must fit in what
      // was available before it was built (its plans' pages are not touched until it trains, so
      // MemAvailable would still count most of them as free). On a GPU its memory is taken, all
      // but its stream's workspace (allocated when it first runs), so what was available is the
      // free memory plus what it took; the device also holds SMA's buffers (the previous move,
      // the corrections' sum in the sync stream's workspace, and a copy of z away from z's device)
      // and its sync stream (the stream's own library handles, as much as a learner's stream
      // holds), and, on z's device, the workspace z's evaluations will need.
      const Device device = replica.device;
      const Trainer& first = *learner->trainer;
      const int64_t each = learner_bytes(first, needs_snapshot());
      const int64_t sma = device.is_cpu() ? 0
                                          : (device == train_.device ? 2 : 3) * first.params().flat_size() * 4 +
                                                first.train_plan().context().resident_bytes();
      // z's trainer evaluates on a stream of its own, whose workspace grows at its first evaluation.
      const int64_t average_workspace =
          device == train_.device ? std::max<int64_t>(0, average_->workspace_bytes() -
                                                            average_->train_plan().context().workspace_size())
                                  : 0;
      // On the host fit() also holds the rounds' batches a learner may still be running: the last
      // staleness + 1 rounds' (a bound of 64 rounds at a large batch holds gigabytes), and those
      // its feeder assembles ahead (up to 64 MiB of them).
      const int64_t held_batches =
          device.is_cpu() ? (options_.staleness + 1) * learners * batch_bytes() : 0;
      BatcherOptions feeder;
      feeder.batch_size = batch_;
      feeder.prefetch_depth = prefetch_depth();
      const int64_t fed_batches = device.is_cpu() ? batcher_bytes(feeder, features_) : 0;
      const int64_t need = per_device * each + sma + average_workspace + held_batches + fed_batches;
      const int64_t have = device.is_cpu() ? cpu_available
                                           : backend_for(device).free_memory(device.index) + first.memory_bytes() -
                                                 first.workspace_bytes();
      if (have > 0 && need > have) {
        std::string of_it = options_.staleness > 0 ? cat(held_batches >> 20, " MiB the batches of the last ",
                                                         options_.staleness + 1, " rounds, for the staleness bound")
                                                   : std::string();
        if (fed_batches > 0)
          of_it += cat(of_it.empty() ? "" : "; ", fed_batches >> 20, " MiB the ", feeder.prefetch_depth + 1,
                       " batches the feeder assembles ahead");
        throw Error(cat("learners: ", learners, " replicas of '", model_.name, "' at batch ", batch_, " need about ",
                        need >> 20, " MiB on ", device.str(), of_it.empty() ? std::string() : cat(" (of it: ", of_it, ")"),
                        ", only ", have >> 20, " MiB are available there"));
      }
    }
    const Tensor& w = learner->trainer->params().flat_params();
    if (carry_state && !learners_.empty()) {  // every replica keeps a predecessor's momentum and step count
      Trainer& predecessor = *learners_[j % learners_.size()]->trainer;
      ParamStore& from = predecessor.params();
      for (const std::string& kind : from.state_kinds())
        learner->trainer->params().flat_state(kind).copy_from(from.flat_state(kind));
      learner->trainer->continue_steps_from(predecessor.steps_done());  // Adam's moments go with their count
    }
    // After momentum SGD on the CPU the SMA recovers s_j = w_j - v_j, and synchronous SGD reads
    // gradients: only the other SMA paths read a snapshot.
    if (needs_snapshot()) learner->snapshot = Tensor::zeros(w.shape(), DType::F32, replica.device);
    built.push_back(std::move(learner));
  }
  // Everything that can fail is built before anything is replaced: a refused resize changes nothing.
  std::unique_ptr<SmaSync> sma;
  std::unique_ptr<DeviceSma> device_sma;
  if (train_.device.is_cpu())
    sma = std::make_unique<SmaSync>(average_->params().flat_params(), learners, options_.sma, options_.staleness > 0);
  else
    device_sma = std::make_unique<DeviceSma>(average_->params().flat_params(), devices_, learners, options_.sma);
  // Every replica starts from z; on a resize, z first takes the old replicas' steps since the last sync.
  if (carry_state) fold_local_steps();
  drain();
  for (auto& learner : built) learner->trainer->params().flat_params().copy_from(average_->params().flat_params());
  // z keeps its momentum through a change of configuration, as the replicas keep theirs above. A
  // lone learner ran no SMA (z was its model), so its group has no move of z to pass on.
  if (carry_state && !learners_.empty() && !alone()) {
    if (sma && sma_) sma->continue_from(*sma_);
    if (device_sma && device_sma_) device_sma->continue_from(*device_sma_);
  }
  device_sma_ = std::move(device_sma);  // the old sync streams drained already (drain() above)
  sma_ = std::move(sma);
  // Each learner's thread runs its ops with up to threads_per_learner - 1 of TBB's workers.
  if (train_.device.is_cpu()) allowance_ = std::make_unique<ThreadAllowance>(learners * (threads_per_learner - 1) + 1);
  learners_ = std::move(built);
  threads_per_learner_ = threads_per_learner;
  // Waiting threads spin briefly only where every learner thread has a core of its own.
  spinning_ = learners * threads_per_learner <= available_cores();
  for (size_t j = 1; j < learners_.size(); ++j) learners_[j]->stream->set_spinning(spinning_);
  if (!ssgd_velocity_.defined() && options_.sync == Sync::Ssgd)
    ssgd_velocity_ = Tensor::zeros(average_->params().flat_params().shape(), DType::F32);
  if (options_.sync == Sync::Ssgd)
    sync_budget_ = std::make_unique<ThreadBudget>(std::min(learners * threads_per_learner, available_cores()));
  mark_synced();  // every replica starts from z
}

void LearnerGroup::resize(int learners, int threads_per_learner) {
  build(learners, threads_per_learner, true);  // a refused resize changes nothing, the tuner's state included
  // The caller's configuration from here: the tuner's choice no longer describes the group, and a
  // tuner measuring in a fit() under way (the resize from one of its callbacks) stops there.
  tuned_ = false;
  tuner_overruled_ = true;
}

bool LearnerGroup::fold_local_steps() {
  settle();
  if (options_.sync != Sync::Sma || alone() || options_.sync_period == 1 || rounds_done_ == last_sync_round_)
    return false;
  std::vector<Tensor> params, now;  // w_j, and a copy of it as the snapshot (the pass reads one, writes the other)
  std::vector<const ExecContext*> streams;
  for (auto& learner : learners_) {
    params.push_back(learner->trainer->params().flat_params());
    now.push_back(Tensor::empty(params.back().shape(), DType::F32, params.back().device()));
    now.back().copy_from(params.back());
    streams.push_back(&learner->trainer->train_plan().context());
  }
  if (device_sma_) {
    device_sma_->round(streams, params, now);
    device_sma_->drain();
  } else {
    sma_->round(params, now, *streams.front());
  }
  mark_synced();
  return true;
}

double LearnerGroup::learner_learning_rate(int learners, double factor) const {
  return train_.learning_rate * lr_scale(options_.lr_scaling, learners) * factor;
}

void LearnerGroup::set_learning_rate_factor(double factor) {
  if (!(factor > 0.0) || !std::isfinite(factor))
    throw Error(cat("learning-rate factor must be a positive number, got ", factor));
  if (factor == lr_factor_) return;
  settle();
  // Reset first: where it throws (a learner's error surfacing), the rate is unchanged and a
  // second call drops it again.
  if (options_.sync == Sync::Sma) reset_replicas();
  const double rate = learner_learning_rate(learners(), factor);
  for (auto& learner : learners_) learner->trainer->set_learning_rate(rate);
  lr_factor_ = factor;
}

LearnerGroup::~LearnerGroup() {
  // Learners' queued tasks use z and the replicas: let them finish before anything is freed.
  // Their errors have nowhere to go from a destructor (settle() waits for every learner first).
  try {
    settle();
  } catch (...) {
  }
}

int64_t LearnerGroup::executor_tuning_runs_left() const {
  settle();  // a learner behind under a staleness bound may be running its executor now
  int64_t left = 0;
  for (const auto& learner : learners_)
    if (const Executor* executor = learner->trainer->executor())
      left = std::max<int64_t>(left, executor->tuning_runs_left());
  return left;
}

double LearnerGroup::one_thread_bound(int learners) const {
  if (!train_.device.is_cpu() || this->learners() != 1 || threads_per_learner_ < 2) return -1.0;
  const Executor* executor = learner_executor(0);
  const double step = executor ? executor->trial_step_seconds("serial") : -1.0;
  return step > 0.0 ? static_cast<double>(learners) * static_cast<double>(batch_) / step : -1.0;
}

void LearnerGroup::settle() const {
  std::exception_ptr first_error;
  for (size_t j = 1; j < learners_.size(); ++j) {
    try {
      learners_[j]->stream->wait();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

const Tensor& LearnerGroup::average() const {
  settle();
  if (device_sma_) device_sma_->drain();  // a host read of z must see the last round's SMA
  refresh_average();
  return average_->params().flat_params();
}

// One learner with the default alpha (1/k = 1): there is nothing to average, so the learner trains
// exactly as single-stream training does and z is its model. (An explicit alpha keeps SMA on, so
// one learner under SMA stays testable.)
bool LearnerGroup::alone() const {
  return learners_.size() == 1 && options_.sma.alpha < 0.0 && options_.sync == Sync::Sma;
}

void LearnerGroup::trace_group_work(const char* name, const char* kind, int64_t start_us, int64_t round,
                                    int learner) const {
  if (!trace_) return;
  trace_->record(TraceEvent{name, kind, "", start_us, trace_->now_us() - start_us, trace_thread_index(), 1, round,
                            learner});
}

void LearnerGroup::refresh_average() const {
  if (!average_stale_) return;
  average_->params().flat_params().copy_from(learners_.front()->trainer->params().flat_params());
  average_stale_ = false;
}

double LearnerGroup::round(std::span<const float> images, std::span<const int32_t> labels) {
  const int64_t samples = learners() * batch_;
  if (static_cast<int64_t>(images.size()) != samples * features_ || static_cast<int64_t>(labels.size()) != samples)
    throw Error(cat("learners: a round of ", learners(), " learners of batch ", batch_, " needs ", samples * features_,
                    " image values and ", samples, " labels, got ", images.size(), " and ", labels.size()));
  return round(images.data(), labels.data());
}

double LearnerGroup::round(const float* images, const int32_t* labels) {
  std::vector<const float*> image_batches;
  std::vector<const int32_t*> label_batches;
  for (int64_t j = 0; j < learners(); ++j) {
    image_batches.push_back(images + j * batch_ * features_);
    label_batches.push_back(labels + j * batch_);
  }
  return round(image_batches, label_batches);
}

double LearnerGroup::round(const std::vector<const float*>& images, const std::vector<const int32_t*>& labels) {
  if (images.size() != learners_.size() || labels.size() != learners_.size())
    throw Error(cat("learners: a round needs one batch per learner (", learners_.size(), "), got ", images.size(),
                    " image and ", labels.size(), " label batches"));
  // Every learner's labels before any learner steps: one refused in its own step would leave the
  // others a step ahead of it.
  for (size_t j = 0; j < learners_.size(); ++j)
    with_learner_named(j, rounds_done_ + 1, [&] {
      learners_[j]->trainer->check_batch_labels(labels[j]);
      return 0.0;
    });
  if (options_.staleness > 0 && !alone()) return round_within_staleness(images, labels);
  // Learners 1..k-1 run on their streams; learner 0 runs on this thread meanwhile: waking a
  // stream costs a cross-core wake-up (tens of microseconds on a VM), and a step at batch 16 is
  // a few hundred. Each learner stages its own batch (on a device: into pinned memory).
  // SMA on the CPU then runs where the steps ran: the learners meet (a Rendezvous) and each takes
  // a share of the pass on its own threads. A pool woken for the pass instead cost the MLP at
  // batch 16 a fifth of its samples/s (docs/benchmarks.md, "The SMA pass on the learners' threads").
  // Under a sync period the rounds between its sync rounds are local steps: no meeting, no SMA.
  const bool sync_round = options_.sync != Sync::Sma || (rounds_done_ + 1) % options_.sync_period == 0;
  const bool snapshot = needs_snapshot() && !alone() && sync_round;
  const bool shared_sma = sma_ && options_.sync == Sync::Sma && !alone() && sync_round;
  const int k = static_cast<int>(learners_.size());
  std::vector<Tensor> params, others;  // w_j, and v_j (sma_from_velocity) or s_j
  for (auto& learner : learners_) {
    params.push_back(learner->trainer->params().flat_params());
    others.push_back(sma_from_velocity() ? learner->trainer->params().flat_state("velocity") : learner->snapshot);
  }
  Rendezvous meet(k, spinning_);
  std::atomic<bool> a_step_failed{false};
  const int64_t this_round = rounds_done_ + 1;
  auto step = [&, snapshot, shared_sma](size_t j) {
    Learner& learner = *learners_[j];
    std::exception_ptr error;
    try {
      if (snapshot) learner.trainer->train_plan().copy(learner.snapshot, learner.trainer->params().flat_params());
      learner.loss = with_learner_named(j, this_round, [&] { return learner.trainer->train_step(images[j], labels[j]); });
    } catch (...) {
      error = std::current_exception();
      a_step_failed = true;  // no SMA this round
    }
    if (shared_sma) meet.arrive_and_wait();  // also after an error: the others must not wait for ever
    if (error) std::rethrow_exception(error);
    if (!shared_sma || a_step_failed) return;
    const int64_t sync_start = trace_clock();
    const ExecContext& threads = learner.trainer->train_plan().context();
    const SmaShare share{static_cast<int>(j), k};
    if (sma_from_velocity())
      sma_->round_after_sgd(params, others, threads, share);
    else
      sma_->round(params, others, threads, share);
    trace_group_work("sma round", "sync", sync_start, this_round, static_cast<int>(j));
  };
  std::exception_ptr first_error;
  size_t submitted = 1;
  try {
    for (; submitted < learners_.size(); ++submitted)
      learners_[submitted]->stream->submit([&step, j = submitted] { step(j); });
  } catch (...) {
    // A learner never handed its step cannot arrive, and learner 0 will not step: arrive for
    // them, so the learners already started do not wait for ever; then nobody applies SMA.
    first_error = std::current_exception();
    if (shared_sma) {
      a_step_failed = true;
      for (size_t j = submitted; j < learners_.size(); ++j) meet.arrive();
      meet.arrive();
    }
  }
  if (!first_error) {
    try {
      step(0);
    } catch (...) {
      first_error = std::current_exception();
    }
  }
  for (size_t j = 1; j < learners_.size(); ++j) {
    try {
      learners_[j]->stream->wait();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
  double loss = 0.0;
  for (auto& learner : learners_) loss += learner->loss;
  const int64_t sync_start = trace_clock();
  if (alone()) {
    average_stale_ = true;  // z is this learner's model; copied over when someone reads z
  } else if (options_.sync == Sync::Ssgd) {
    ssgd_update();
    trace_group_work("ssgd update", "sync", sync_start, this_round);
  } else if (device_sma_ && sync_round) {
    std::vector<const ExecContext*> streams;
    for (auto& learner : learners_) streams.push_back(&learner->trainer->train_plan().context());
    device_sma_->round(streams, params, others);
    trace_group_work("sma round", "sync", sync_start, this_round);
  }
  ++rounds_done_;
  if (sync_round) mark_synced();
  return loss / static_cast<double>(learners_.size());
}

// Bounded staleness: learner j's task is its step and then the absorption of its correction into
// z, on its own stream; learner 0's runs on this thread. The clock gate: return once no learner
// has more than `staleness` tasks left, so no learner is more than that many rounds behind.
double LearnerGroup::round_within_staleness(const std::vector<const float*>& images,
                                            const std::vector<const int32_t*>& labels) {
  const bool from_velocity = sma_from_velocity();
  const int64_t this_round = rounds_done_ + 1;  // for the trace: tasks run later, on the learners' threads
  auto task = [this, from_velocity, this_round](size_t j, const float* x, const int32_t* y) {
    Learner& learner = *learners_[j];
    ParamStore& params = learner.trainer->params();
    if (!from_velocity) learner.trainer->train_plan().copy(learner.snapshot, params.flat_params());
    learner.loss = with_learner_named(j, this_round, [&] { return learner.trainer->train_step(x, y); });
    const int64_t absorb_start = trace_clock();
    sma_->absorb(static_cast<int>(j), params.flat_params(),
                 from_velocity ? params.flat_state("velocity") : learner.snapshot, from_velocity,
                 learner.trainer->train_plan().context());
    trace_group_work("sma absorb", "sync", absorb_start, this_round, static_cast<int>(j));
  };
  std::exception_ptr first_error;
  try {
    for (size_t j = 1; j < learners_.size(); ++j)
      learners_[j]->stream->submit([task, j, x = images[j], y = labels[j]] { task(j, x, y); });
  } catch (...) {
    // (Out of memory.) Learner 0 does not step; the learners already handed this round's batches
    // finish with them below before the error leaves, as after a failed step.
    first_error = std::current_exception();
  }
  if (!first_error) {
    try {
      task(0, images[0], labels[0]);
    } catch (...) {
      first_error = std::current_exception();
    }
  }
  for (size_t j = 1; j < learners_.size(); ++j) {
    try {
      learners_[j]->stream->wait_at_most(static_cast<size_t>(options_.staleness));
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) {
    // Queued tasks hold the caller's batches, which the caller may free once the error reaches
    // it: every learner finishes what it was given first (its later errors are dropped; the
    // first is the one reported).
    for (size_t j = 1; j < learners_.size(); ++j) {
      try {
        learners_[j]->stream->wait();
      } catch (...) {
      }
    }
    std::rethrow_exception(first_error);
  }
  double loss = 0.0;
  for (auto& learner : learners_) loss += learner->loss;
  ++rounds_done_;
  return loss / static_cast<double>(learners_.size());
}

// After a momentum-SGD step w_j = s_j + v_j, so on the CPU SMA recovers s_j from the velocity and
// no snapshot is copied before the step (a pass over the parameters saved per learner per round).
bool LearnerGroup::sma_from_velocity() const {
  return options_.sync == Sync::Sma && train_.optimizer == "sgd" && train_.device.is_cpu();
}

bool LearnerGroup::needs_snapshot() const { return options_.sync == Sync::Sma && !sma_from_velocity(); }

double LearnerGroup::evaluate(const Dataset& data) {
  settle();
  refresh_average();
  if (device_sma_) device_sma_->order_before(average_->train_plan().context());
  return average_->evaluate(data);
}

void LearnerGroup::drain() {
  if (device_sma_) device_sma_->drain();
}

void LearnerGroup::reset_replicas() {
  fold_local_steps();
  refresh_average();
  std::vector<Tensor> params;
  for (auto& learner : learners_) params.push_back(learner->trainer->params().flat_params());
  if (device_sma_)
    device_sma_->reset_replicas(params);
  else
    sma_->reset_replicas(params);
}

TrainReport LearnerGroup::fit(const Dataset& train, const Dataset* test, int64_t epochs, int64_t max_rounds) {
  const FitInProgress running(fitting_);
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  if (epochs < 1 || epochs > kMostEpochs) throw Error(cat("epochs must be in 1..", kMostEpochs, ", got ", epochs));
  if (max_rounds < 0) throw Error(cat("max_rounds must be >= 0 (0: no limit), got ", max_rounds));
  check_consistent(train, "training set");
  check_samples_fit(model_, train, "training set");
  check_labels_fit(model_, average_->classes(), train, "training set");
  if (test) check_consistent(*test, "test set");
  if (test) check_samples_fit(model_, *test, "test set");
  if (test) check_labels_fit(model_, average_->classes(), *test, "test set");
  // Rounds run by round() alone (or a fit() that threw) since the last sync are folded in first:
  // every epoch then starts and ends with z holding every round, which a checkpoint saved between
  // syncs relies on. After a fit() that returned there is nothing to fold.
  fold_local_steps();
  BatcherOptions batcher_options;
  batcher_options.batch_size = batch_;
  batcher_options.seed = train_.seed;
  // A cut epoch's order is drawn for its training set's size: with another set it starts again.
  if (epoch_samples_done_ > 0 && epoch_data_samples_ > 0 && epoch_data_samples_ != train.count) {
    warn(cat(epoch_samples_done_, " samples of epoch ", epochs_done_ + 1, " were trained in the order of a training set of ",
             epoch_data_samples_, " samples; this one has ", train.count, ": that epoch starts again"));
    set_epoch_samples(0);
  }
  batcher_options.first_epoch = epochs_done_;  // a resumed run (or a second fit()) continues the data order
  // ... from the batch a cut epoch stopped at (a whole batch of this run's size; with another batch
  // size up to batch - 1 samples are trained again, none skipped).
  const int64_t epoch_count = train.count / std::max<int64_t>(1, batch_);  // the batcher checks batch_ itself
  const int64_t resume_batch = std::min(epoch_samples_done_ / std::max<int64_t>(1, batch_), std::max<int64_t>(0, epoch_count - 1));
  batcher_options.first_batch = resume_batch;
  batcher_options.prefetch_depth = prefetch_depth();
  Batcher batcher(train, batcher_options);
  const int64_t per_epoch = batcher.batches_per_epoch();  // batches; a round takes one per learner
  // Training time from here (the Batcher started first, as Trainer::fit's), evaluations of z taken
  // out: samples/s and the tuner's windows do not count them.
  // Before an evaluation the learners settle and, on a GPU, the last round's SMA finishes on the
  // clock (the evaluation would otherwise wait for it off the clock).
  FitClock clock(test ? train_.eval_every : 0, [&] { return evaluate(*test); }, evaluated_, [this] {
    settle();
    drain();
  });

  // The tuner decides what to measure next; fit() measures windows of rounds and resizes.
  const int cores = options_.tune_cores > 0 ? options_.tune_cores : available_cores();
  const int tuner_step = static_cast<int>(devices_.size());  // one learner per device at a time
  std::optional<LearnerTuner> tuner;
  // A tuner that settled in an earlier fit() over the same cores keeps its choice: a caller that
  // trains an epoch per fit() would otherwise measure every configuration again each epoch.
  tuned_ = options_.tune && tuned_ && tuned_cores_ == cores && learners() <= per_epoch;
  tuned_cores_ = cores;
  tuner_overruled_ = false;
  if (options_.tune && !tuned_) {
    TunerOptions tuning;
    tuning.cores = cores;
    tuning.step = tuner_step;
    // A round takes one batch per learner from one epoch: never more learners than an epoch's batches.
    tuning.max_learners = std::max(tuner_step, static_cast<int>(std::min<int64_t>(per_epoch, options_.max_learners)));
    // CPU learners need a core each: the cores counted now, where the group was made with more
    // (an affinity mask narrowed since) would have the tuner grow onto shared cores.
    if (train_.device.is_cpu()) tuning.max_learners = std::min(tuning.max_learners, std::max(1, cores));
    tuning.threshold = options_.tune_threshold;
    tuning.confirm_band = options_.tune_confirm_band;
    tuning.confirm_gains = options_.tune_confirm_gains;
    tuning.cut_below = options_.tune_cut_below;
    tuning.leap = options_.tune_leap;
    tuner.emplace(tuning);
    history_.clear();
    if (learners() != tuner_step || threads_per_learner_ != cores) build(tuner_step, cores, true);
  }
  // A round takes one batch per learner from one epoch: an epoch shorter than a round trains
  // nothing. Checked again at every epoch's start: a callback may have grown the group.
  auto check_a_round_fits = [&] {
    if (per_epoch < learners())
      throw Error(cat(learners(), " learners of batch ", batch_, " need ", learners() * batch_,
                      " samples a round; the training set has ", train.count, " (fewer learners or a smaller batch)"));
  };
  check_a_round_fits();
  // The window being measured: its rounds and samples so far, after a warm-up of `warmup_rounds`.
  int64_t measured_rounds = 0, warmup_rounds = 0;
  int64_t measured_samples = 0;
  double measure_start = clock.training_seconds();
  auto measuring_seconds = [&] { return clock.training_seconds() - measure_start; };
  // A new configuration warms up first; a close call's second window of the same one does not.
  auto start_measuring = [&](bool warm_up) {
    warmup_rounds = warm_up ? executor_tuning_runs_left() + 3 : 0;
    measure_start = clock.training_seconds();
    measured_rounds = 0;
    measured_samples = 0;
  };
  if (tuner) start_measuring(true);

  // One batch per learner a round, handed over as they came; kept while a learner may still be
  // running that round (up to `staleness` rounds back).
  std::deque<std::vector<Batch>> in_flight;
  // A run stopped by an error still writes its trace, after the learners below have settled.
  const TraceOnError trace_on_error(trace_.get(), train_.trace_path);
  // Learners still running (a staleness bound) read `in_flight`'s batches: whatever ends fit(), an
  // error included, waits for them before those batches and the batcher go.
  struct SettleOnExit {
    const LearnerGroup& group;
    ~SettleOnExit() {
      try {
        group.settle();
      } catch (...) {  // the error that is leaving fit() is the one to report
      }
    }
  } settle_on_exit{*this};
  std::vector<const float*> images;
  std::vector<const int32_t*> labels;
  TrainReport report;
  int64_t rounds = 0, samples = 0, batches_in_epoch = 0, batches_done = 0;
  // Epochs are numbered from the start of training: a resumed run's first is epochs_done() + 1.
  const int64_t epochs_before = epochs_done_;
  bool keep_going = true;
  for (int64_t epoch = 1; epoch <= epochs && (max_rounds == 0 || rounds < max_rounds) && keep_going; ++epoch) {
    const int64_t number = epochs_before + epoch;
    check_a_round_fits();  // before the epoch changes anything (its drop resets the replicas)
    // The step decay: a drop resets every replica to z (a resumed run's first epoch takes the
    // rate its number has; its replicas are z's already).
    if (!train_.lr_drop_epochs.empty()) set_learning_rate_factor(learning_rate_factor_at(train_, number));
    EpochReport epoch_report;
    epoch_report.epoch = number;
    const double epoch_start = clock.training_seconds();
    Clock::time_point last_report = Clock::now();
    double loss_sum = 0.0;
    int64_t epoch_rounds = 0, epoch_samples = 0;
    bool counted_done = false;  // the epoch's last round has counted it done: nothing more trains in it
    for (batches_in_epoch = epoch == 1 ? resume_batch : 0; !counted_done &&
         batches_in_epoch + learners() <= per_epoch && (max_rounds == 0 || rounds < max_rounds) && keep_going;) {
      const int k = learners();
      while (static_cast<int64_t>(in_flight.size()) > options_.staleness) in_flight.pop_front();
      std::vector<Batch>& batches = in_flight.emplace_back();
      images.clear(), labels.clear();
      const int64_t fetch_start = trace_clock();
      for (int j = 0; j < k; ++j) batches.push_back(batcher.next());
      trace_group_work("next batches", "feeder", fetch_start, rounds_done_ + 1);  // waits only if the prefetcher fell behind
      for (const Batch& batch : batches) images.push_back(batch.images.data()), labels.push_back(batch.labels.data());
      batches_in_epoch += k;
      batches_done += k;
      loss_sum += round(images, labels);
      set_epoch_samples(batches_in_epoch * batch_), epoch_data_samples_ = train.count;
      ++rounds, ++epoch_rounds;
      samples += k * batch_, epoch_samples += k * batch_;
      if (tuner && tuner_overruled_) tuner.reset();  // a callback resized the group: its configuration stands
      if (tuner && !tuned_) {
        if (warmup_rounds > 0) {  // not measured: the executors' profiling and 3 rounds, and the time floor
          const bool floor_reached = measuring_seconds() >= options_.tune_warmup_seconds;
          if (warmup_rounds > 1 || floor_reached) --warmup_rounds;
          if (warmup_rounds == 0) {
            // An executor's trial lasts a time, not a count: it may need more steps than it said.
            if (const int64_t left = executor_tuning_runs_left(); left > 0)
              warmup_rounds = left + 3;
            else if (rounds_done_ % options_.sync_period != 0)
              warmup_rounds = 1;  // a window starts after a sync round, so it holds whole periods
            else
              measure_start = clock.training_seconds();
          }
        } else {
          ++measured_rounds;
          measured_samples += k * batch_;
        }
        // Under a sync period a window ends on a sync round only: the resize that may follow
        // starts every replica from z, which then holds every step trained (and a window holds
        // whole periods).
        const bool at_sync = rounds_done_ % options_.sync_period == 0;
        const bool window_done = at_sync && warmup_rounds == 0 && measured_rounds >= options_.tune_window &&
                                 measuring_seconds() >= options_.tune_window_seconds;
        // A clear loss may end its window after a quarter of it. (Under a staleness bound the rate
        // here counts rounds handed out, some not yet trained; settle() below only lowers it.)
        const bool cut_short =
            !window_done && at_sync && options_.tune_cut_short && warmup_rounds == 0 &&
            4 * measured_rounds >= options_.tune_window && 4 * measuring_seconds() >= options_.tune_window_seconds &&
            tuner->losing(static_cast<double>(measured_samples) / std::max(measuring_seconds(), 1e-9));
        if (window_done || cut_short) {
          settle();  // under a staleness bound, count only the samples that have been trained on
          drain();   // on a GPU, with the window's last SMA pass
          const double rate = static_cast<double>(measured_samples) / measuring_seconds();
          if (window_done)
            tuner->measured(rate);
          else
            tuner->measured_cut_short(rate);
          TunerStep next = tuner->current();
          // One-thread learners that could not gain enough are not run: the tuner goes on as after a
          // loss (its leap, which may be bounded in turn, or it keeps the best).
          while (!tuner->settled() && options_.tune_bound && next.threads_per_learner == 1) {
            const double most = one_thread_bound(next.learners);
            if (!(most > 0.0 && tuner->bounded(most))) break;
            next = tuner->current();
          }
          const bool change = next.learners != k || next.threads_per_learner != threads_per_learner_;
          // Refused when it would not fit in memory: the group stays in the configuration just
          // measured, and so does the tuner, except after a refused leap, which settles at the
          // best so far; the group returns there (and stays if that is refused too).
          for (bool retry = change; retry;) {
            try {
              build(next.learners, next.threads_per_learner, true);
              retry = false;
            } catch (const Error&) {
              tuner->refused();
              next = tuner->current();
              retry = next.learners != learners() || next.threads_per_learner != threads_per_learner_;
            }
          }
          history_ = tuner->history();
          tuned_ = tuner->settled();
          if (!tuned_) start_measuring(change);
        }
      }
      // The epoch's last round (no other fits, at the learner count the tuner left) counts it done
      // at once: a save from a callback, or a fit() that throws from here on, must not leave a cut
      // epoch of every batch behind (which a resumed run would train again, or a load refuse).
      counted_done = batches_in_epoch + learners() > per_epoch;
      if (counted_done) set_epoch_position(epochs_done_ + 1, 0);
      const bool last = counted_done || rounds == max_rounds;
      if (progress_ && (last || seconds_since(last_report) > 0.5)) {
        last_report = Clock::now();
        const double elapsed = clock.training_seconds();
        // What rounds of the current k can still take: an epoch drops the per_epoch % k batches
        // no round takes, so with 3 learners an epoch of 40 batches trains 39.
        const int64_t whole_rounds = per_epoch / learners() * learners();
        const int64_t epoch_batches = batches_in_epoch + (per_epoch - batches_in_epoch) / learners() * learners();
        int64_t total_batches = batches_done + (epoch_batches - batches_in_epoch) + (epochs - epoch) * whole_rounds;
        if (max_rounds > 0) total_batches = std::min(total_batches, batches_done + (max_rounds - rounds) * learners());
        Progress p{number, epochs_before + epochs, batches_in_epoch, epoch_batches, batches_done, total_batches,
                   loss_sum / epoch_rounds, samples / std::max(elapsed, 1e-9),
                   clock.eta_seconds(batches_done, total_batches), last};
        progress_(p);
      }
      if (!last) keep_going = clock.between_batches(number, batches_done - k, batches_done);
    }
    // An epoch is one pass: the per_epoch % k batches a round of k could not take are dropped, so
    // the next epoch starts at its own first batch (they would shift every later epoch).
    const bool epoch_complete = counted_done || batches_in_epoch + learners() > per_epoch;
    if (epoch_complete)
      for (int64_t left = per_epoch - batches_in_epoch; left > 0; --left) batcher.next();
    // Complete without its last round counting it: a callback between rounds grew the group past
    // the batches left, or a cut epoch resumed with fewer left than a round takes.
    if (epoch_complete && !counted_done) set_epoch_position(epochs_done_ + 1, 0);
    if (epoch_complete && epoch_rounds == 0) continue;  // nothing to report (no loss, no samples/s), evaluate or save
    // Under a sync period an epoch ends holding every step in z: its evaluation, and a checkpoint
    // saved after it, see the local steps since the last sync (one more sync, on the epoch's clock;
    // an evaluation at this batch before it, eval_every's or one that stopped fit(), is redone).
    if (fold_local_steps()) clock.model_changed();
    settle();  // the epoch's samples/s count finished steps only (and, on a GPU, SMA's last pass)
    drain();
    epoch_report.steps = epoch_rounds;
    epoch_report.learning_rate = learning_rate();
    epoch_report.seconds = clock.training_seconds() - epoch_start;
    epoch_report.mean_loss = loss_sum / std::max<int64_t>(1, epoch_rounds);
    epoch_report.train_accuracy = -1.0;
    epoch_report.samples_per_second = epoch_samples / std::max(epoch_report.seconds, 1e-9);
    report.final_loss = epoch_report.mean_loss;
    // The epoch was counted done by its last round, before the epoch's evaluation, whose callback
    // may save(): its checkpoint holds the epoch finished (a cut epoch goes on from where it
    // stopped).
    if (test) epoch_report.test_accuracy = clock.epoch_end(number, batches_done, keep_going);
    report.epochs.push_back(epoch_report);
    if (epoch_done_ && !clock.off_the_clock([&] { return epoch_done_(epoch_report); })) break;
  }
  report.steps = rounds;
  for (const EpochReport& e : report.epochs) report.seconds += e.seconds;
  report.samples_per_second = samples / std::max(report.seconds, 1e-9);
  if (trace_) {
    settle();  // learners still running under a staleness bound record into the trace
    report.trace_error = trace_->write_after_training(train_.trace_path);
  }
  return report;
}

// z <- momentum SGD step with the mean of the learners' gradients (the sgd_update op's math),
// then every replica copies z.
void LearnerGroup::ssgd_update() {
  const Tensor& z = average_->params().flat_params();
  const int64_t n = z.numel();
  // The replicas' learning rate: build() scaled it by LearnerOptions::lr_scaling.
  const float lr = static_cast<float>(learners_.front()->trainer->learning_rate()),
              momentum = static_cast<float>(train_.momentum),
              decay = static_cast<float>(train_.weight_decay), share = 1.0f / static_cast<float>(learners_.size());
  float* w = z.f32();
  float* v = ssgd_velocity_.f32();
  std::vector<const float*> grads;  // pointers taken once: the loop below is the hot one
  std::vector<float*> replicas;
  for (auto& learner : learners_) {
    grads.push_back(learner->trainer->params().flat_grads().f32());
    replicas.push_back(learner->trainer->params().flat_params().f32());
  }
  sync_budget_->parallel_for(n, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float g = 0.0f;
      for (const float* grad : grads) g += grad[i];
      math::sgd_step(w[i], v[i], g * share, lr, momentum, decay);
    }
    for (float* replica : replicas) std::copy(w + begin, w + end, replica + begin);
  });
}

}  // namespace quiver
