// quiver-bench-time-to-accuracy: training time (evaluations excluded) until the test accuracy
// reaches a target, single-stream (one model, all cores, auto policy) vs learners tuned while
// training (--learners auto, SMA);
// with --device cuda, one CUDA stream vs learners on streams of that GPU.
// Rules, the same for every run: SGD lr 0.01, momentum 0.9, batch 64 per learner (--batch), seed 1 (--seed), no schedule
// change; the test set is evaluated --evals-per-epoch times an epoch (every that fraction of an
// epoch's batches, every learner's counted, and at each epoch's end; evaluation time excluded
// from the clock); stop at the target or after --max-epochs. Time is training time up to the
// evaluation that first reached the target. --fixed K adds K learners fixed from the start (no
// tuning) as a third side: what the learners' average model needs in samples, without the tuner's
// one-learner start. With --lr-scaling linear the learner runs' k learners train at k x lr (the
// linear scaling rule), with sqrt at sqrt(k) x lr (k = 1, single-stream's case, unchanged). With --runs N each model runs N
// times, single-stream, auto (and fixed) in turn, in reverse order every second run (the side
// that goes first meets the process's one-time costs); the table gives medians and each run's
// ratios to single-stream. --seed S changes the seed of every run (initialisation and shuffling).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "core/error.h"
#include "models/models.h"
#include "runtime/atomic_file.h"
#include "runtime/fashion_mnist.h"
#include "runtime/learners.h"
#include "runtime/thread_budget.h"
#include "runtime/trainer.h"

namespace {

using namespace quiver;

struct Outcome {
  double seconds = 0.0, accuracy = 0.0;
  double epochs = 0.0;  // training batches / batches in an epoch
  bool reached = false;
};

// Runs fit() through `on_evaluation`, stopping at the first evaluation at or above the target.
// That one is the outcome: under a sync period a group that stops mid-epoch folds its local steps
// and evaluates again at the same batch, which may read below the target.
template <typename Engine>
Outcome run(Engine& engine, const std::function<TrainReport()>& fit, double target, int64_t per_epoch) {
  Outcome outcome;
  engine.on_evaluation([&](const Evaluation& e) {
    if (outcome.reached) return false;
    outcome.seconds = e.seconds;
    outcome.accuracy = e.test_accuracy;
    outcome.epochs = static_cast<double>(e.batches) / static_cast<double>(per_epoch);
    outcome.reached = e.test_accuracy >= target;
    std::printf("    %.2f epochs: %.2f%% (%.1f s of training so far)\n", outcome.epochs, 100.0 * e.test_accuracy,
                outcome.seconds);
    std::fflush(stdout);
    return !outcome.reached;
  });
  fit();
  return outcome;
}

using bench::fixed;

std::string cell(const Outcome& o) {
  return o.reached ? cat(fixed(o.seconds, 1), " s (", fixed(o.epochs, 2), " ep)")
                   : cat("not reached in ", fixed(o.epochs, 2), " ep (", fixed(100 * o.accuracy, 1), "%)");
}

// One run: its outcome. Several: the median seconds and epochs of the runs that reached the target.
std::string cell(const std::vector<Outcome>& runs) {
  if (runs.size() == 1) return cell(runs.front());
  std::vector<double> seconds, epochs;
  for (const Outcome& o : runs)
    if (o.reached) seconds.push_back(o.seconds), epochs.push_back(o.epochs);
  if (seconds.empty()) return cat("not reached in any of ", runs.size(), " runs");
  Outcome median;
  median.reached = true;
  median.seconds = bench::median(seconds);
  median.epochs = bench::median(epochs);
  return cat(cell(median), ", median of ",
             seconds.size() == runs.size() ? cat(runs.size()) : cat(seconds.size(), " of ", runs.size(), " reached"));
}

// single / `other` of each pair ("-" where neither reached the target, "<other> missed" or
// "single missed" where one did not) and, over several, their median, a miss counting as a ratio
// beyond every measured one on its side.
std::string ratio_cell(const std::vector<Outcome>& single, const std::vector<Outcome>& learners,
                       const std::string& other = "auto") {
  std::string each;
  std::vector<double> ratios;
  for (size_t r = 0; r < single.size(); ++r) {
    const bool one = single[r].reached, many = learners[r].reached;
    std::string text = "-";
    if (one && many) {
      ratios.push_back(single[r].seconds / learners[r].seconds);
      text = fixed(ratios.back(), 2);
    } else if (one) {
      ratios.push_back(0.0), text = cat(other, " missed");
    } else if (many) {
      ratios.push_back(std::numeric_limits<double>::infinity()), text = "single missed";
    }
    each += cat(r == 0 ? "" : ", ", text);
  }
  if (single.size() == 1 || ratios.empty()) return each;
  // The middle value; of two, their mean, or the lower where one is a miss (a mean with a miss
  // means nothing, and the lower is the reading less kind to auto).
  std::sort(ratios.begin(), ratios.end());
  const size_t n = ratios.size();
  const double low = ratios[(n - 1) / 2], high = ratios[n / 2];
  const bool miss = low == 0.0 || std::isinf(high);
  const double median = n % 2 == 1 || miss ? low : 0.5 * (low + high);
  const std::string middle =
      median == 0.0 ? cat(other, " missed") : std::isinf(median) ? "single missed" : fixed(median, 2);
  return cat(each, " (median **", middle, "**", ratios.size() < single.size() ? cat(" of ", ratios.size()) : "", ")");
}

}  // namespace

constexpr char kUsage[] =
    "usage: quiver-bench-time-to-accuracy [options]\n"
    "Training time (evaluations not counted) until the test accuracy reaches MLP 85%, CNN 86%,\n"
    "LSTM 80%: single-stream vs --learners auto (SGD lr 0.01, momentum 0.9, batch 64 per\n"
    "learner, seed 1), and with\n"
    "--fixed K, K learners fixed from the start.\n"
    "\n"
    "  --models LIST     comma-separated, of mlp,cnn,lstm (default all three)\n"
    "  --batch B         batch size of single-stream and of every learner (default 64)\n"
    "  --max-epochs N    give up after N epochs (default 10)\n"
    "  --evals-per-epoch E  evaluate the test set E times an epoch (default 20: a coarser grid\n"
    "                    rounds each time up to its next evaluation)\n"
    "  --device D        cpu (default: all cores), cuda or cuda:N (a learner is one CUDA stream)\n"
    "  --staleness S     the learner runs' clock gate: 0 = synchronous rounds (default), S > 0 =\n"
    "                    learners up to S rounds apart (CPU only)\n"
    "  --sync-period N   the learner runs' SMA every N rounds (default 1: every round; with\n"
    "                    synchronous rounds only)\n"
    "  --cut-short on|off  the tuner ends a clearly slower configuration's window after a\n"
    "                    quarter of it (default on; off: every window in full)\n"
    "  --bound on|off    the tuner does not run one-thread learners whose samples/s, estimated\n"
    "                    from the serial step the executor timed, is no gain (default on)\n"
    "  --lr-scaling none|linear|sqrt  the learner runs' learning rate: linear trains k learners\n"
    "                    at k x lr (the linear scaling rule), sqrt at sqrt(k) x lr; default\n"
    "                    none: lr 0.01 whatever k\n"
    "  --runs N          runs per model, single-stream, auto (and fixed) in turn, in reverse\n"
    "                    order every second run (default 3): the table gives the medians and\n"
    "                    every run's ratios\n"
    "  --fixed K         also train K >= 2 learners fixed from the start (on the CPU the cores\n"
    "                    split evenly, at most one learner a core; no tuning) in every run,\n"
    "                    after auto (first, in the runs in reverse order) (default 0: not)\n"
    "  --seed S          seed of every run (default 1)\n"
    "  --output FILE     also write the table there (atomically)\n";

constexpr char kOptions[] =
    "--models --batch --max-epochs --evals-per-epoch --device --staleness --sync-period --cut-short --bound "
    "--lr-scaling --runs --fixed --seed --output";

int main(int argc, char** argv) {
  quiver::bench::line_buffered_output();
  if (quiver::bench::help_requested(argc, argv, kUsage)) return 0;
  std::vector<std::string> names = {"mlp", "cnn", "lstm"};
  int max_epochs = 10;
  int evals_per_epoch = 20;  // a quarter-epoch grid moved ratios by up to 1.5x
  int64_t batch = TrainOptions{}.batch;
  std::string output;
  Device device;
  int staleness = 0;
  int sync_period = 1;
  bool cut_short = true;
  bool bound = true;
  LrScaling lr_scaling = LrScaling::None;
  int runs = 3;  // a median of several: one run's time to a target moves by a tenth or more
  int fixed_learners = 0;
  uint64_t seed = TrainOptions{}.seed;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string flag = bench::flag_name(argv[i]);
      std::string value = bench::flag_value(argc, argv, i, kOptions);
      if (flag == "--models") {
        names = bench::model_names(flag, value);
      } else if (flag == "--batch") {
        batch = bench::to_int(flag, value, bench::kMaxBatch);
      } else if (flag == "--max-epochs") {
        max_epochs = bench::to_int(flag, value, 10000);
      } else if (flag == "--evals-per-epoch") {
        evals_per_epoch = bench::to_int(flag, value, 1000);
      } else if (flag == "--output") {
        check_writable(value, flag);
        output = value;
      } else if (flag == "--device") {
        device = bench::for_flag(flag, [&] { return Device::parse(value); });
      } else if (flag == "--cut-short") {
        cut_short = bench::on_off(flag, value);
      } else if (flag == "--bound") {
        bound = bench::on_off(flag, value);
      } else if (flag == "--lr-scaling") {
        lr_scaling = bench::for_flag(flag, [&] { return parse_lr_scaling(value); });
      } else if (flag == "--runs") {
        runs = bench::to_int(flag, value, 100);
      } else if (flag == "--fixed") {
        fixed_learners = bench::to_int(flag, value, 256, 0);
        // One learner with the default alpha is single-stream training again (LearnerGroup::alone()).
        if (fixed_learners == 1) throw Error("--fixed: 1 learner trains as single-stream does; give 2 or more (0: none)");
      } else if (flag == "--seed") {
        // The range of quiver-train's --seed, so that any run of it can be repeated here.
        seed = static_cast<uint64_t>(bench::to_whole(flag, value, std::numeric_limits<int64_t>::max(), 0));
      } else if (flag == "--staleness") {
        staleness = bench::to_int(flag, value, kMaxStaleness, 0);
      } else if (flag == "--sync-period") {
        sync_period = bench::to_int(flag, value, kMaxSyncPeriod);
      } else {
        throw bench::unknown_option(flag, kOptions);
      }
    }
    bench::check_staleness_on(device, staleness > 0);
    bench::check_device_present(device);
    if (staleness > 0 && sync_period > 1)
      throw Error("--sync-period: a sync period is for synchronous rounds; not with --staleness");
    if (device.is_cpu() && fixed_learners > available_cores())
      throw Error(cat("--fixed: ", fixed_learners, " learners need a core each; ", available_cores(), " are available"));
  } catch (const Error& error) {
    std::fprintf(stderr, "quiver-bench-time-to-accuracy: %s\n", error.what());
    return 2;
  }
  try {
    const std::string dir = default_fashion_mnist_dir();
    Dataset train = load_fashion_mnist(dir, Split::Train), test = load_fashion_mnist(dir, Split::Test);
    // A round takes one batch per learner from one epoch: a fixed group too large for the training
    // set is refused here, not after the models' single-stream and auto runs.
    if (fixed_learners > 0 && fixed_learners * batch > train.count) {
      std::fprintf(stderr,
                   "quiver-bench-time-to-accuracy: --fixed: %d learners of --batch %lld need %lld samples a round; "
                   "the training set has %lld (fewer learners or a smaller batch)\n",
                   fixed_learners, static_cast<long long>(batch), static_cast<long long>(fixed_learners * batch),
                   static_cast<long long>(train.count));
      return 2;
    }
    const int fixed_threads = std::max(1, available_cores() / std::max(1, fixed_learners));
    // The learner runs' sync period, in their names (the log's lines and the table's columns).
    const std::string every = sync_period > 1 ? cat(", SMA every ", sync_period, " rounds") : std::string();
    const std::string fixed_name = cat(bench::configuration_cell(fixed_learners, fixed_threads, device), " fixed", every);
    std::string table = cat("| model | target | single-stream | learners auto", every, " | auto's choice | single / auto |");
    table += fixed_learners > 0 ? cat(" ", fixed_name, " | single / fixed |\n|---|---|---|---|---|---|---|---|\n")
                                : std::string("\n|---|---|---|---|---|---|\n");
    for (const std::string& name : names) {
      const double target = name == "mlp" ? 0.85 : name == "cnn" ? 0.86 : 0.80;
      TrainOptions options;
      options.threads = available_cores();
      options.epochs = max_epochs;
      options.batch = batch;
      options.device = device;
      options.seed = seed;
      // Neither side counts training accuracy: single-stream's Trainer::fit would otherwise copy
      // each step's probabilities to the host (on a GPU, ~7% of a step), which the learners skip.
      options.train_accuracy = false;
      const int64_t per_epoch = train.count / options.batch;  // the batcher's full batches
      options.eval_every = std::max<int64_t>(1, per_epoch / evals_per_epoch);
      // k learners of `threads` each (tuned from there when `tune`), under the bench's options.
      auto learner_options = [&](int k, int threads, bool tune) {
        LearnerOptions learners;
        learners.learners = k;
        learners.threads_per_learner = threads;
        learners.tune = tune;
        learners.staleness = staleness;
        learners.sync_period = sync_period;
        learners.tune_cut_short = cut_short;
        learners.tune_bound = bound;
        learners.lr_scaling = lr_scaling;
        return learners;
      };
      std::vector<Outcome> singles, autos, fixeds;
      std::vector<std::string> choices;  // auto's, in order of first appearance, with counts below
      std::vector<int> counts;
      for (int r = 1; r <= runs; ++r) {
        const std::string run_name = runs == 1 ? std::string() : cat(" (run ", r, " of ", runs, ")");
        auto run_single = [&] {
          std::printf("%s, target %.0f%%: single-stream%s\n", name.c_str(), 100 * target, run_name.c_str());
          Trainer single(models::by_name(name), options);
          singles.push_back(run(single, [&] { return single.fit(train, &test); }, target, per_epoch));
        };
        auto run_auto = [&] {
          std::printf("%s, target %.0f%%: learners auto%s%s\n", name.c_str(), 100 * target, every.c_str(),
                      run_name.c_str());
          LearnerGroup group(models::by_name(name), options, learner_options(1, available_cores(), true));
          autos.push_back(run(group, [&] { return group.fit(train, &test, max_epochs); }, target, per_epoch));
          std::string windows;  // what the tuner measured (or bounded) and kept, for the log
          for (const TunerStep& step : group.tuner_history())
            windows += cat(windows.empty() ? "" : "; ",
                           bench::configuration_cell(step.learners, step.threads_per_learner, device),
                           step.bounded ? " not run, at most " : " ", static_cast<int>(step.samples_per_second), "/s",
                           step.cut_short ? " (cut short)" : "", step.again ? " (again)" : "", step.leap ? " (leap)" : "");
          std::printf("    tuner: %s%s\n", windows.c_str(), group.tuned() ? " (the last: kept)" : " (not settled)");
          const TunerStep chosen = group.tuner_history().empty() ? TunerStep{} : group.tuner_history().back();
          // Unsettled: the configuration training ended with (the tuner was still measuring it).
          const int ended_with = group.tuned() ? chosen.learners : group.learners();
          const int threads = group.tuned() ? chosen.threads_per_learner : group.threads_per_learner();
          const std::string choice =
              cat(bench::configuration_cell(ended_with, threads, device), group.tuned() ? "" : " (tuner not settled)");
          const auto known = std::find(choices.begin(), choices.end(), choice);
          if (known == choices.end())
            choices.push_back(choice), counts.push_back(1);
          else
            ++counts[known - choices.begin()];
        };
        auto run_fixed = [&] {
          std::printf("%s, target %.0f%%: %s%s\n", name.c_str(), 100 * target, fixed_name.c_str(), run_name.c_str());
          LearnerGroup group(models::by_name(name), options, learner_options(fixed_learners, fixed_threads, false));
          fixeds.push_back(run(group, [&] { return group.fit(train, &test, max_epochs); }, target, per_epoch));
        };
        // Single-stream first in odd runs, last in even ones: the side that goes first pays the
        // process's one-time costs and meets the host's phase first, so it must not always be one.
        std::vector<std::function<void()>> sides = {run_single, run_auto};
        if (fixed_learners > 0) sides.push_back(run_fixed);
        if (r % 2 == 0) std::reverse(sides.begin(), sides.end());
        for (const auto& side : sides) side();  // each side's trainer or group is gone before the next
        if (runs > 1)
          std::printf("    run %d: single / auto %s%s\n", r, ratio_cell({singles.back()}, {autos.back()}).c_str(),
                      fixed_learners > 0
                          ? cat(", single / fixed ", ratio_cell({singles.back()}, {fixeds.back()}, "fixed")).c_str()
                          : "");
      }
      std::string choice;
      for (size_t c = 0; c < choices.size(); ++c)
        choice += cat(c == 0 ? "" : ", ", choices[c], runs == 1 ? std::string() : cat(" (", counts[c], " of ", runs, ")"));
      std::string row = cat("| ", name, " | ", 100 * target, "% | ", cell(singles), " | ", cell(autos), " | ", choice,
                            " | ", ratio_cell(singles, autos), " |");
      if (fixed_learners > 0) row += cat(" ", cell(fixeds), " | ", ratio_cell(singles, fixeds, "fixed"), " |");
      row += "\n";
      table += row;
      std::printf("%s", row.c_str());
    }
    std::printf("%s", table.c_str());
    if (!output.empty()) write_file_atomically(output, table, "results");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "quiver-bench-time-to-accuracy: %s\n", error.what());
    return 1;
  }
  return 0;
}
