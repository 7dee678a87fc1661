// quiver-train: train a bundled model (MLP, CNN or LSTM) on Fashion-MNIST, with a live progress
// line, test accuracy per epoch and the final throughput.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>

#include "core/error.h"
#include "examples/train_options.h"
#include "models/models.h"
#include "runtime/fashion_mnist.h"
#include "runtime/learners.h"

namespace {

// Under a step decay (--lr-drop) each epoch's line names the rate it trained at.
std::string rate_of(const quiver::TrainOptions& options, const quiver::EpochReport& epoch) {
  if (options.lr_drop_epochs.empty()) return "";
  char text[48];
  std::snprintf(text, sizeof(text), "  lr %g", epoch.learning_rate);
  return text;
}

// --learners N|auto: k replicas with SMA; with auto the tuner's measurements are printed, the
// first of which is one learner on all cores (single-stream), measured in this run.
int train_learners(const quiver::TrainCommand& command, const quiver::Dataset& train, const quiver::Dataset& test,
                   bool live, const std::function<void(const quiver::Progress&)>& show_progress,
                   const std::function<bool(const quiver::Evaluation&)>& show_evaluation) {
  using namespace quiver;
  LearnerOptions options;
  options.learners = command.learners;
  options.tune = command.learners_auto;
  options.threads_per_learner = learner_threads(command);
  if (command.alpha >= 0.0) options.sma.alpha = command.alpha;
  if (command.mu_z >= 0.0) options.sma.mu_z = command.mu_z;
  options.sync = command.sync == "ssgd" ? Sync::Ssgd : Sync::Sma;
  options.staleness = command.staleness;
  options.sync_period = command.sync_period;
  options.lr_scaling = command.lr_scaling;
  options.tune_cores = command.train.threads;
  const std::string sync = command.staleness > 0     ? cat(command.sync, ", staleness ", command.staleness, " rounds")
                           : command.sync_period > 1 ? cat(command.sync, " every ", command.sync_period, " rounds")
                                                     : command.sync;
  options.devices = command.gpus;
  LearnerGroup group(models::by_name(command.model), command.train, options);
  // --epochs and --max-steps count from the start of training: a resumed run trains what is left,
  // so the command that was stopped, run again with --resume, finishes the job.
  int64_t epochs = command.train.epochs, max_rounds = command.train.max_steps;
  if (!command.resume.empty()) {
    group.load(command.resume);
    std::cout << "resumed from " << command.resume << " (" << group.rounds_done() << " rounds, "
              << group.epochs_done() << " epoch(s) done"
              << (group.epoch_samples_done() > 0 &&
                          (group.epoch_data_samples() == 0 || group.epoch_data_samples() == train.count)
                      ? cat(", epoch ", group.epochs_done() + 1, " goes on after ", group.epoch_samples_done(), " samples")
                      : std::string())
              << ")\n";
    epochs -= group.epochs_done();
    if (max_rounds > 0) max_rounds -= group.rounds_done();
    if (epochs < 1 || (command.train.max_steps > 0 && max_rounds < 1)) {
      std::cout << "nothing left to train: "
                << (epochs < 1 ? cat(group.epochs_done(), " of --epochs ", command.train.epochs, " epoch(s) are done")
                               : cat(group.rounds_done(), " of --max-steps ", command.train.max_steps, " rounds are done"))
                << "\n";
      return 0;
    }
  }
  const bool on_cpu = command.train.device.is_cpu();
  // "2 learner(s) x 1 thread(s)" on the CPU; "2 learner(s) (CUDA streams)" on a GPU, where
  // threads do not apply.
  auto configuration = [&](int learners, int threads) {
    return on_cpu ? cat(learners, " learner(s) x ", threads, " thread(s)")
                  : cat(learners, " learner(s) (CUDA streams)");
  };
  if (command.learners_auto && !on_cpu)
    std::cout << "learners: auto (start with 1 learner = 1 CUDA stream per GPU on " << command.gpus
              << " GPU(s) from " << command.train.device.str()
              << "; add one per GPU while samples/s rises by more than 10%, and where one does not, try twice "
                 "as many once), sync "
              << sync << "\n";
  else if (command.learners_auto)
    std::cout << "learners: auto (start with 1 learner on " << command.train.threads
              << " threads; add one, the threads split evenly, while samples/s rises by more than 10%, and "
                 "where one does not, try twice as many once), sync "
              << sync << "\n";
  else
    std::cout << "learners: " << configuration(group.learners(), group.threads_per_learner()) << ", sync " << sync
              << "\n";
  if (!command.quiet) group.on_progress(show_progress);
  group.on_evaluation(show_evaluation);
  // --checkpoint: after every epoch too, so a run stopped in epoch e keeps what e - 1 epochs
  // trained; resuming from it continues the data order from there.
  int64_t saved_at_round = -1;
  auto save = [&](const char* when) {
    group.save(command.checkpoint);
    saved_at_round = group.rounds_done();
    if (live) std::cout << "\n";
    std::cout << "saved the average model to " << command.checkpoint << " (" << when << ", round "
              << group.rounds_done() << ")\n";
  };
  // Only an epoch trained to its end is saved as one (max_rounds may cut the last short: the save
  // after training keeps that, and a resumed run goes on inside it); the last epoch's save is that one.
  // A save that fails here (a full disk, the directory removed) is a warning: training goes on, the
  // epochs' results are printed, and the save after training tries again (exit status 1 if it fails).
  if (!command.checkpoint.empty())
    group.on_epoch([&](const EpochReport& epoch) {
      if (group.epochs_done() == epoch.epoch && epoch.epoch < command.train.epochs) {
        try {
          save(cat("after epoch ", epoch.epoch).c_str());
        } catch (const Error& error) {
          if (live) std::cout << "\n" << std::flush;
          std::cerr << "quiver-train: warning: the save after epoch " << epoch.epoch << " failed: " << error.what()
                    << "; training goes on, and saves again after training\n";
        }
      }
      return true;
    });
  TrainReport report = group.fit(train, &test, epochs, max_rounds);
  if (live) std::cout << "\n";
  for (const EpochReport& e : report.epochs)
    std::printf("epoch %lld: loss %.4f  test accuracy of the average model %.2f%%  (%.1f s, %.0f samples/s)%s\n",
                static_cast<long long>(e.epoch), e.mean_loss, 100.0 * e.test_accuracy, e.seconds,
                e.samples_per_second, rate_of(command.train, e).c_str());
  const std::vector<TunerStep>& history = group.tuner_history();
  if (command.learners_auto) {
    std::printf("tuner (samples/s over at least %d rounds and %.1f s per configuration, a quarter of that for a clear "
                "loss, measured in this run):\n",
                options.tune_window, options.tune_window_seconds);
    // Once settled, the last entry repeats the choice; every other entry is a measurement, or a
    // configuration not run because one_thread_bound() said it could not gain (bounded).
    const size_t measured = group.tuned() ? history.size() - 1 : history.size();
    // Single-stream's samples/s: its fastest window, as the kept entry counts its own. On several
    // GPUs the tuner starts from one learner a GPU, which is the baseline then.
    double single_rate = 0.0;
    const bool one_start = history.empty() || history.front().learners == 1;
    // One learner trains exactly as single-stream training does only under SMA's default alpha
    // (LearnerGroup::alone()): an explicit --alpha keeps SMA's pass on, synchronous SGD its update.
    const std::string one = command.sync == "ssgd" ? "one learner under synchronous SGD"
                            : command.alpha >= 0.0 ? "one learner under SMA with --alpha"
                                                   : "single-stream";
    const std::string baseline = one_start ? one : cat("the start (", history.front().learners, " learners)");
    for (size_t i = 0; i < measured; ++i) {
      const TunerStep& step = history[i];
      if (step.bounded) {
        std::printf("  %s: not run, at most about %.0f samples/s (its learners' one-thread steps as the "
                    "executor's serial schedule ran them here): no %.0f%% gain\n",
                    configuration(step.learners, step.threads_per_learner).c_str(), step.samples_per_second,
                    100 * options.tune_threshold);
        continue;
      }
      const bool single = step.learners == history.front().learners &&
                          step.threads_per_learner == history.front().threads_per_learner;
      if (single) single_rate = std::max(single_rate, step.samples_per_second);
      std::printf("  %s: %.0f samples/s%s%s%s%s\n", configuration(step.learners, step.threads_per_learner).c_str(),
                  step.samples_per_second,
                  !single     ? ""
                  : on_cpu    ? cat("  (", one, ": one learner, all cores)").c_str()
                  : one_start ? cat("  (", one, ": one learner, one CUDA stream)").c_str()
                              : "  (the start: one learner, one CUDA stream, on each GPU)",
                  step.leap && !step.again ? "  (a leap over a plateau)" : "",
                  step.again ? "  (measured again: a gain or a close call)" : "",
                  step.cut_short ? "  (window cut short: clearly slower)" : "");
    }
    if (group.tuned()) {
      const TunerStep& chosen = history.back();
      std::printf("chose %s: %.0f samples/s, %.2fx %s\n",
                  configuration(chosen.learners, chosen.threads_per_learner).c_str(), chosen.samples_per_second,
                  chosen.samples_per_second / single_rate, baseline.c_str());
    } else {
      // Which limit ended training: --max-steps' rounds, or the epochs (a --max-steps not reached).
      const bool stopped_by_max_steps =
          command.train.max_steps > 0 && group.rounds_done() >= command.train.max_steps;
      std::printf("not settled: training ended while %s were being measured (%s gives it the rounds)\n",
                  configuration(group.learners(), group.threads_per_learner()).c_str(),
                  stopped_by_max_steps ? "a larger --max-steps" : "more --epochs");
    }
  }
  std::printf("throughput: %.0f samples/s over %lld rounds (%.1f s)\n", report.samples_per_second,
              static_cast<long long>(report.steps), report.seconds);
  if (!command.checkpoint.empty() && saved_at_round != group.rounds_done()) save("after training");
  return report.trace_error.empty() ? 0 : 1;  // a trace not written was warned about; the rest is kept
}

}  // namespace

namespace {

int run(int argc, char** argv) {
  using namespace quiver;
  TrainCommand command;
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    command = parse_train_command(args);
  } catch (const std::exception& error) {  // quiver::Error: a bad value, naming the flag
    // --help still answers beside a bad value (as the benches' does): the user is asking how.
    if (std::find(args.begin(), args.end(), "--help") != args.end() || std::find(args.begin(), args.end(), "-h") != args.end()) {
      std::cout << train_usage();
      return 0;
    }
    std::cerr << "quiver-train: " << error.what() << "\n";
    return 2;
  }
  if (command.help) {
    std::cout << train_usage();
    return 0;
  }
  for (const std::string& warning : command.warnings) std::cerr << "quiver-train: warning: " << warning << "\n";
  try {
    // A device that does not exist is said before the data is read, not after.
    if (!command.train.device.is_cpu())
      for (int d = 0; d < command.gpus; ++d)
        backend_for(Device{command.train.device.kind, command.train.device.index + d});
    std::string dir = command.data_dir.empty() ? default_fashion_mnist_dir() : command.data_dir;
    Dataset train = load_fashion_mnist(dir, Split::Train);
    Dataset test = load_fashion_mnist(dir, Split::Test);
    const TrainOptions& o = command.train;
    std::cout << "quiver-train: model " << command.model << ", batch " << o.batch << ", ";
    if (o.device.is_cpu()) {
      std::cout << o.threads << " thread(s), policy " << o.policy;
      if (o.policy == "fixed") std::cout << " " << o.inter << "x" << o.intra;
    } else {
      std::cout << "device " << o.device.str() << " (kernels in order on each learner's stream, CUDA graphs "
                << (o.device_graphs ? "on" : "off") << ")";
    }
    std::cout << ", " << o.optimizer << " lr " << number_text(o.learning_rate);
    if (!o.lr_drop_epochs.empty()) {
      std::cout << " (x" << number_text(o.lr_drop_factor) << " at epoch" << (o.lr_drop_epochs.size() > 1 ? "s" : "");
      for (size_t i = 0; i < o.lr_drop_epochs.size(); ++i) std::cout << (i == 0 ? " " : ", ") << o.lr_drop_epochs[i];
      std::cout << ")";
    }
    if (o.weight_decay > 0.0) std::cout << ", weight decay " << number_text(o.weight_decay);
    std::cout << ", seed " << o.seed << ", data " << dir << " (" << train.count << " train, "
              << test.count << " test)\n";
    const bool live = !command.quiet && isatty(fileno(stdout));
    // A log (not a terminal) gets a line each time the step passes a multiple of 100 and at every
    // epoch's end: reports come every half second, so a step that is exactly a multiple of 100
    // rarely has one, and with k learners the step moves k at a time.
    auto show_progress = [live, logged_epoch = int64_t{-1}, logged_hundreds = int64_t{0}](const Progress& p) mutable {
      char line[160];
      std::snprintf(line, sizeof(line), "epoch %lld/%lld  step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s",
                    static_cast<long long>(p.epoch), static_cast<long long>(p.epochs),
                    static_cast<long long>(p.step), static_cast<long long>(p.steps_in_epoch), p.loss,
                    p.samples_per_second, quiver::clock_text(p.eta_seconds).c_str());
      if (live) {
        std::cout << "\r" << line << "   " << std::flush;
      } else if (const int64_t hundreds = p.step / 100; p.last || hundreds > (p.epoch == logged_epoch ? logged_hundreds : 0)) {
        logged_epoch = p.epoch;
        logged_hundreds = hundreds;
        std::cout << line << "\n";
      }
    };
    // --eval-every: each evaluation on a line of its own (the epochs' are listed at the end).
    auto show_evaluation = [live, every = o.eval_every](const Evaluation& e) {
      if (every > 0) {
        char line[160];
        std::snprintf(line, sizeof(line),
                      "batch %lld of this run (epoch %lld): test accuracy %.2f%% after %.1f s of training",
                      static_cast<long long>(e.batches), static_cast<long long>(e.epoch), 100.0 * e.test_accuracy,
                      e.seconds);
        std::printf("%s%-90s\n", live ? "\r" : "", line);
        std::fflush(stdout);
      }
      return true;
    };
    if (command.learners > 0) return train_learners(command, train, test, live, show_progress, show_evaluation);
    Trainer trainer(models::by_name(command.model), o);
    if (const Executor* executor = trainer.executor(); executor && executor->policy() == Policy::Auto) {
      if (executor->tuning_runs_left() == 0)  // profiles cached, and one thread leaves one schedule
        std::cout << "auto: op profiles from " << o.profile_cache << "; one schedule, nothing to try\n";
      else if (executor->loaded_from_cache())
        std::cout << "auto: op profiles from " << o.profile_cache << "; trying schedules over the first "
                  << executor->tuning_runs_left() << " steps\n";
      else
        std::cout << "auto: profiling ops and trying schedules over the first " << executor->tuning_runs_left()
                  << " steps" << (o.profile_cache.empty() ? std::string() : cat(" (profile cache: ", o.profile_cache, ")"))
                  << "\n";
    }
    if (!command.quiet) trainer.on_progress(show_progress);
    trainer.on_evaluation(show_evaluation);
    TrainReport report = trainer.fit(train, &test);
    if (live) std::cout << "\n";
    for (const EpochReport& e : report.epochs)
      std::printf("epoch %lld: loss %.4f  train accuracy %.2f%%  test accuracy %.2f%%  (%.1f s, %.0f samples/s)%s\n",
                  static_cast<long long>(e.epoch), e.mean_loss, 100.0 * e.train_accuracy,
                  100.0 * e.test_accuracy, e.seconds, e.samples_per_second, rate_of(o, e).c_str());
    std::printf("throughput: %.0f samples/s over %lld steps (%.1f s)\n", report.samples_per_second,
                static_cast<long long>(report.steps), report.seconds);
    if (const Plan& plan = trainer.train_plan(); !o.device.is_cpu() && o.device_graphs && !plan.replaying_graph()) {
      const std::string& why = plan.device_graph_failure();
      std::cout << "CUDA graphs: not used, every step ran eagerly"
                << (why.empty() ? std::string() : cat(" (capture failed: ", why, ")")) << "\n";
    }
    if (command.explain) {
      if (trainer.executor())
        std::cout << trainer.executor()->explain();
      else
        std::cout << "explain: no executor (empty policy)\n";
    }
    if (!report.trace_error.empty()) return 1;  // warned about; the results above stand
  } catch (const std::exception& error) {  // quiver::Error; out of memory, a thread that could not start: a message, not an abort
    // A live progress line (a terminal) is ended first; a log gets the message alone.
    std::cerr << (!command.quiet && isatty(fileno(stdout)) ? "\n" : "") << "quiver-train: " << error.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Line by line also into a file or a pipe, so a log keeps every line a killed run printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int status = run(argc, argv);
  // The results are the point of a run: output that could not be written (a full disk) is an
  // error, not a silent success. (A closed pipe ends the process by SIGPIPE, as it ends other tools.)
  std::cout.flush();
  if (status == 0 && (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout))) {
    std::cerr << "quiver-train: cannot write the results to standard output\n";
    return 1;
  }
  return status;
}
