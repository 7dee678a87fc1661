// quiver-bench-learners: training throughput of k learners kept consistent by SMA (LearnerGroup)
// against single-stream execution (one learner, all cores, the default auto policy), per model
// and per-learner batch. Every configuration is built once in one process; each round times
// `steps` steps (rounds) of every configuration in turn, and at least `window` seconds (a window
// of 20 steps of the MLP at batch 16 is ~20 ms, within reach of one hiccup of a shared machine),
// so drift hits all alike; medians over rounds, ratios to single-stream. Threads: a learner gets cores / k threads
// (at least one); with more learners than cores the learners share cores through the OS.
// --device cuda[:N]: the same comparison on a GPU, a learner being one CUDA stream (single-stream:
// one learner, one stream), SMA on a sync stream ordered by events.
// --staleness LIST: the learner configurations (and the tuner) once per clock gate, 0 being
// synchronous rounds; a timed window ends when every learner has finished its rounds.
// --sync-periods LIST: the same once per sync period (SMA every N rounds, 1 being every round),
// side by side in one run; with synchronous rounds only.
// Around every run it probes how far apart the host has put the first two cores
// (runtime/placement.h) and counts the runs that ran far apart.
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "core/error.h"
#include "models/models.h"
#include "runtime/atomic_file.h"
#include "runtime/fashion_mnist.h"
#include "runtime/learners.h"
#include "runtime/placement.h"
#include "runtime/thread_budget.h"
#include "runtime/trainer.h"

namespace {

using namespace quiver;

// How the learners of one row keep in step: a clock gate (staleness) and a sync period.
struct Gate {
  int staleness = 0;
  int sync_period = 1;
};

struct Options : bench::GridOptions {
  std::vector<int> learners = {1, 2, 3, 4};
  std::vector<int> staleness = {0};
  std::vector<int> sync_periods = {1};
  std::vector<Gate> gates;  // every staleness with every sync period (one of the two lists is {0} or {1})
  double window = 0.25;  // seconds, at least, per timed window
  bool tune_leap = true;  // the tuner's leap over a plateau (LearnerOptions::tune_leap)
  Device device;
  Options() { batches = {16, 64}; }
};

constexpr char kOptions[] =
    "--models --batches --learners --staleness --sync-periods --device --threads --warmup --steps --runs --window "
    "--tune-leap --output";

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = bench::flag_name(argv[i]);
    std::string value = bench::flag_value(argc, argv, i, kOptions);
    if (bench::parse_grid_flag(flag, value, o)) continue;
    if (flag == "--device") {
      o.device = bench::for_flag(flag, [&] { return Device::parse(value); });
      continue;
    }
    if (flag == "--window") {
      o.window = bench::to_int(flag, value, 600000) / 1000.0;
      continue;
    }
    if (flag == "--tune-leap") {
      o.tune_leap = bench::on_off(flag, value);
      continue;
    }
    if (flag == "--staleness") {
      o.staleness.clear();
      for (int s : bench::int_list(flag, value, kMaxStaleness, 0)) o.staleness.push_back(s);
      continue;
    }
    if (flag == "--sync-periods") {
      o.sync_periods = bench::int_list(flag, value, kMaxSyncPeriod);
      continue;
    }
    if (flag != "--learners") throw bench::unknown_option(flag, kOptions);
    o.learners.clear();
    for (int k : bench::int_list(flag, value, 256)) o.learners.push_back(k);
  }
  const bool stale = std::any_of(o.staleness.begin(), o.staleness.end(), [](int s) { return s > 0; });
  bench::check_staleness_on(o.device, stale);
  bench::check_device_present(o.device);
  if (stale && std::any_of(o.sync_periods.begin(), o.sync_periods.end(), [](int p) { return p > 1; }))
    throw Error("--sync-periods: a sync period is for synchronous rounds; measure it without --staleness");
  for (int staleness : o.staleness)
    for (int period : o.sync_periods) o.gates.push_back(Gate{staleness, period});
  return o;
}

}  // namespace

constexpr char kUsage[] =
    "usage: quiver-bench-learners [options]\n"
    "Training samples/s of k learners kept consistent by SMA vs single-stream, and the tuner's pick.\n"
    "\n"
    "  --models LIST     comma-separated, of mlp,cnn,lstm (default all three)\n"
    "  --batches LIST    per-learner batch sizes (default 16,64)\n"
    "  --learners LIST   learner counts to measure (default 1,2,3,4)\n"
    "  --staleness LIST  clock gates to measure: 0 = synchronous rounds (default), S > 0 = learners\n"
    "                    up to S rounds apart (CPU only)\n"
    "  --sync-periods LIST  SMA every N rounds, per N listed (default 1: every round; not with\n"
    "                    --staleness)\n"
    "  --device D        cpu (default), cuda or cuda:N (a learner is one CUDA stream)\n"
    "  --threads T       CPU threads in all (default: all available cores)\n"
    "  --warmup N --steps N --runs N   warm-up steps, steps per timed round, rounds (default 40, 20, 5)\n"
    "  --window MS       a timed window lasts at least MS milliseconds (default 250)\n"
    "  --tune-leap on|off  the tuner's leap over a plateau (default on; off: add one learner at a time only)\n"
    "  --output FILE     also write the table there (atomically)\n";

int main(int argc, char** argv) {
  quiver::bench::line_buffered_output();
  if (quiver::bench::help_requested(argc, argv, kUsage)) return 0;
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const Error& error) {
    std::fprintf(stderr, "quiver-bench-learners: %s\n", error.what());
    return 2;
  }
  if (o.device.is_cpu()) quiver::bench::warn_if_oversubscribed("quiver-bench-learners", o.threads);
  std::string header = "| model | batch per learner | staleness | sync period | single-stream samples/s |";
  std::string rule = "|---|---|---|---|---|";
  for (int k : o.learners) header += cat(" ", k, " learner(s) |"), rule += "---|";
  for (int k : o.learners) header += cat(" ", k, " / single |"), rule += "---|";
  header += " auto chose | auto's pick / best fixed | runs far apart |", rule += "---|---|---|";
  std::string table = header + "\n" + rule + "\n";
  const std::string single = o.device.is_cpu() ? cat("one learner, ", o.threads, " threads, auto policy")
                                                : cat("one learner, one CUDA stream on ", o.device.str());
  std::printf("# training samples/s, k learners with SMA vs single-stream (%s); "
              "median of %d rounds of at least %d steps and %.0f ms after %d warm-up steps\n%s",
              single.c_str(), o.runs, o.steps, 1000 * o.window, o.warmup, table.c_str());
  std::fflush(stdout);
  std::string notes;  // below the table: the runs with the cores close together, alone
  try {
    PlacementLog placement;
    for (const std::string& model : o.models)
      for (int64_t batch : o.batches) {
        const int most = *std::max_element(o.learners.begin(), o.learners.end());
        // Every configuration of this row is built before any is timed, and a replica's pages are
        // touched only when it trains, so each one's memory check is given what the ones before
        // it left (memory_limit) rather than what the system still reports free.
        const int64_t available = o.device.is_cpu() ? available_memory_bytes() : -1;
        const int64_t pool_bytes = bench::BatchPool::bytes_for(models::by_name(model), batch * most, 8);
        int64_t committed = pool_bytes;
        auto left_after = [&](const std::string& what) {
          if (available < 0) return int64_t{0};  // unknown: no limit (each check reads the system's)
          if (committed >= available)
            throw Error(cat(model, " at --batches ", batch, " with up to ", most, " learners: ", what, " need about ",
                            committed >> 20, " MiB, only ", available >> 20, " MiB are available"));
          return available - committed;
        };
        left_after("the random batches");
        // An object refused by its memory check (its message counts MiB, and says "memory limit"
        // of the limit set above) is named with what the bench holds besides it; other errors
        // pass as they are.
        auto within_what_is_left = [&](const std::string& what, auto&& build) {
          try {
            return build();
          } catch (const Error& error) {
            if (available < 0 || std::string(error.what()).find(" MiB") == std::string::npos) throw;
            throw Error(cat(what, ": of ", available >> 20, " MiB available, what this bench built before it takes ",
                            "about ", committed >> 20, " MiB: ", error.what()));
          }
        };
        const bench::BatchPool data(models::by_name(model), batch * most, 8);
        TrainOptions train;
        train.batch = batch;
        train.eval_batch = 1;
        train.threads = o.threads;
        train.profile_cache = "";
        train.retrial_seconds = 0.0;  // auto is timed on its trial's schedule: no retrial inside a window
        train.device = o.device;
        train.memory_limit = left_after("the random batches");
        Trainer single = within_what_is_left(cat(model, " single-stream at batch ", batch),
                                             [&] { return Trainer(models::by_name(model), train); });
        if (o.device.is_cpu()) committed += single.memory_bytes();
        // groups[g][i]: o.learners[i] learners under gate o.gates[g].
        auto options_for = [&](int learners, int threads, Gate gate) {
          LearnerOptions options{learners, threads, SmaOptions{}};
          options.staleness = gate.staleness;
          options.sync_period = gate.sync_period;
          return options;
        };
        std::vector<std::vector<std::unique_ptr<LearnerGroup>>> groups(o.gates.size());
        for (size_t g = 0; g < o.gates.size(); ++g)
          for (int k : o.learners) {
            train.memory_limit = left_after("the configurations before this one");
            groups[g].push_back(within_what_is_left(cat(model, " with ", k, " learner(s) at batch ", batch), [&] {
              return std::make_unique<LearnerGroup>(models::by_name(model), train,
                                                    options_for(k, std::max(1, o.threads / k), o.gates[g]));
            }));
            // Its replicas, and z: one more model's parameters and buffers (about a replica's).
            if (o.device.is_cpu()) committed += (k + 1) * learner_bytes(single);
          }
        // Warm-up, one configuration at a time: `warmup` steps (rounds), then on until its
        // executors (auto policy) have finished profiling and their trials, which for the CNN
        // takes longer than 40 steps; a profiling step is slower than a settled one, and it would
        // count against whichever it hit. Nothing else runs meanwhile: a trial whose steps
        // alternate with other configurations' rounds (their threads, their cache footprint)
        // chose differently from the same trial alone (the MLP's one learner chose intra where
        // single-stream, the same computation, chose serial, and ran at 0.55-0.60x). Until
        // 2026-11-27 the first `warmup` steps still alternated, and an executor that finished
        // profiling within them began its trial among the other configurations' rounds.
        for (int i = 0; i < o.warmup || (single.executor() && !single.executor()->tuned()); ++i)
          single.train_step(data.images_of(i), data.labels_of(i));
        for (auto& gate : groups)
          for (auto& group : gate) {
            for (int i = 0; i < o.warmup || group->executor_tuning_runs_left() > 0; ++i)
              group->round(data.images_of(i), data.labels_of(i));
            group->settle();  // under a staleness bound, its learners' last rounds
          }
        // With the trial's figures: a single-stream that settled on a slow schedule (an LSTM on
        // serial at 0.64x, 2026-11-27) shows what its trial measured.
        if (const Executor* executor = single.executor(); executor && executor->policy() == Policy::Auto) {
          std::string summary = executor->trial_summary();
          if (summary.empty()) summary = cat("schedule: ", executor->chosen_schedule());  // no candidates to try
          std::printf("# %s, batch %lld: the single-stream executor's %s\n", model.c_str(), static_cast<long long>(batch),
                      summary.c_str());
        }
        // Steps per second over a window of at least `steps` steps and `window` seconds. It ends
        // when every learner has finished its rounds (settle: with a staleness bound a round
        // returns before the learners behind have run it) and, on a GPU, the last round's SMA on
        // the sync streams (drain), which would otherwise run into the next window.
        auto steps_per_second = [&](auto&& step, auto&& finish) {
          using Clock = std::chrono::steady_clock;
          finish();
          const Clock::time_point start = Clock::now();
          auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
          int steps = 0;
          do {
            for (int s = 0; s < o.steps; ++s) step(steps + s);
            steps += o.steps;
          } while (seconds() < o.window);
          finish();
          return steps / seconds();
        };
        std::vector<double> single_rates;
        std::vector<std::map<int, std::vector<double>>> rates(o.gates.size());
        // Each run times every configuration once, in another order each run (bench::run_order),
        // so no configuration always follows the same one (whose idle threads and cache footprint
        // it would inherit every time).
        std::vector<std::function<void()>> measure;
        measure.push_back([&] {
          single_rates.push_back(
              batch * steps_per_second([&](int s) { single.train_step(data.images_of(s), data.labels_of(s)); }, [] {}));
        });
        for (size_t g = 0; g < groups.size(); ++g)
          for (size_t i = 0; i < o.learners.size(); ++i)
            measure.push_back([&, g, i] {
              LearnerGroup& group = *groups[g][i];
              rates[g][o.learners[i]].push_back(
                  batch * o.learners[i] *
                  steps_per_second([&](int s) { group.round(data.images_of(s), data.labels_of(s)); },
                                   [&] { group.settle(), group.drain(); }));
            });
        std::vector<double> probes;
        for (int run = 0; run < o.runs; ++run) {
          probes.push_back(placement.probe());
          for (size_t m : bench::run_order(measure.size(), run)) measure[m]();
        }
        probes.push_back(placement.probe());
        const double base = bench::median(single_rates);
        Dataset pool_data;
        pool_data.rows = 28, pool_data.cols = 28;
        pool_data.images = data.images;
        pool_data.labels = data.labels;
        pool_data.count = static_cast<int64_t>(data.labels.size());
        if (o.device.is_cpu()) committed += pool_bytes;
        for (size_t g = 0; g < o.gates.size(); ++g) {
          std::map<int, std::vector<double>>& rate = rates[g];
          std::string row = cat("| ", model, " | ", batch, " | ", o.gates[g].staleness, " | ", o.gates[g].sync_period,
                                " | ", static_cast<int64_t>(base), " |");
          for (int k : o.learners) row += cat(" ", static_cast<int64_t>(bench::median(rate[k])), " |");
          for (int k : o.learners) row += cat(" ", bench::fixed(bench::median(rate[k]) / base), " |");
          // The tuner (--learners auto) on the same data and clock gate, with quiver-train's
          // ceiling (on the CPU a learner a core at least) and no higher than the most learners
          // measured here; its pick is judged by the fixed configurations' rates measured above.
          LearnerOptions tuned = options_for(1, o.threads, o.gates[g]);
          tuned.tune = true;
          tuned.tune_cores = o.threads;
          tuned.tune_leap = o.tune_leap;
          tuned.max_learners = o.device.is_cpu() ? std::min(most, o.threads) : most;
          train.memory_limit = left_after("the configurations measured and a copy of the random batches");
          LearnerGroup tuner(models::by_name(model), train, tuned);
          tuner.on_epoch([&tuner](const EpochReport&) { return !tuner.tuned(); });  // an epoch is a few rounds here
          tuner.fit(pool_data, nullptr, 1000000);
          const TunerStep chosen = tuner.tuner_history().empty() ? TunerStep{} : tuner.tuner_history().back();
          // The best configuration the tuner could have picked: none with more learners than it
          // may try (on the CPU a learner a core), even where such a one was measured above.
          double best = 0.0;
          for (int k : o.learners)
            if (k <= tuned.max_learners) best = std::max(best, bench::median(rate[k]));
          if (rate.count(chosen.learners))
            row += cat(" ", bench::configuration_cell(chosen.learners, chosen.threads_per_learner, o.device), " | ",
                       bench::fixed(bench::median(rate[chosen.learners]) / best), " |");
          else
            row += cat(" ", chosen.learners, " (not measured) | - |");
          const std::vector<bool> far = bench::far_rounds(placement, probes);
          const int far_count = static_cast<int>(std::count(far.begin(), far.end(), true));
          row += cat(" ", placement.enabled() ? cat(far_count, " of ", o.runs) : std::string("-"), " |");
          table += row + "\n";
          std::printf("%s\n", row.c_str());
          if (far_count > 0 && far_count < o.runs) {
            const double near_base = bench::median(bench::near_only(single_rates, far));
            std::string note = cat("# ", model, " ", batch, ", staleness ", o.gates[g].staleness, ", sync period ",
                                   o.gates[g].sync_period, ", the ", o.runs - far_count,
                                   " runs with the cores close together:");
            for (int k : o.learners)
              note += cat(" ", k, " / single ", bench::fixed(bench::median(bench::near_only(rate[k], far)) / near_base), ";");
            notes += note + "\n";
            std::printf("%s\n", note.c_str());
          }
          std::fflush(stdout);
        }
      }
    notes += cat("# ", placement.summary(), "\n");
    std::printf("# %s\n", placement.summary().c_str());
    if (!o.output.empty()) write_file_atomically(o.output, table + notes, "results");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "quiver-bench-learners: %s\n", error.what());
    return 1;
  }
  return 0;
}
