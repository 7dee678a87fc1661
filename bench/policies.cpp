// quiver-bench-policies: step time of the executor's policies side by side, per model and batch,
// with all cores: serial, intra (TensorFlow's recommended one op at a time on all threads), every
// fixed inter x intra pair with more than one op side by side, and auto (the performance model).
// All policies run the same compiled plan in one process; each round times every policy once, in
// turn, so drift on a shared machine hits all alike; the table gives medians over rounds and
// ratios to intra (> 1: faster than intra). It also reports the
// performance model's accuracy per model: the median error of predicted vs measured op times in
// the auto schedule, and at held-out thread counts where there are three or more.
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "core/error.h"
#include "models/models.h"
#include "runtime/atomic_file.h"
#include "runtime/placement.h"
#include "runtime/thread_budget.h"
#include "runtime/trainer.h"

namespace {

using namespace quiver;

struct Options : bench::GridOptions {
  Options() { steps = 50; }
};

constexpr char kOptions[] = "--models --batches --threads --warmup --steps --runs --output";

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = bench::flag_name(argv[i]);
    if (!bench::parse_grid_flag(flag, bench::flag_value(argc, argv, i, kOptions), o)) throw bench::unknown_option(flag, kOptions);
  }
  return o;
}

struct Config {
  std::string label, policy;
  int inter = 1, intra = 1;
};

std::vector<Config> configs(int threads) {
  std::vector<Config> list = {{"serial", "serial"}, {"intra", "intra"}};
  for (int inter = 2; inter <= threads; ++inter)
    if (threads % inter == 0) list.push_back({cat("fixed ", inter, "x", threads / inter), "fixed", inter, threads / inter});
  list.push_back({"auto", "auto"});
  return list;
}

// One model and batch: every policy's Executor over the same compiled plan (one set of
// parameters, trained on by all), each warmed up (auto: until its schedule is settled); then
// `runs` rounds, each timing `steps` steps of every policy in turn, in another order each round
// (bench::run_order). Same process, same buffers, interleaved: the fairest comparison a shared
// machine allows.
struct Result {
  std::map<std::string, std::vector<double>> step_seconds;  // by config label, one per round
  std::map<std::string, int> chosen;                       // auto's settled schedule
  std::vector<double> schedule_errors, held_out_errors;
  std::vector<double> placement_ns;  // hand-off probes: before each round and after the last
};

Result measure(const std::string& model, int64_t batch, const std::vector<Config>& list, const Options& o,
               PlacementLog& placement) {
  const bench::BatchPool data(models::by_name(model), batch);
  TrainOptions options;
  options.batch = batch;
  options.eval_batch = 1;
  options.policy = "";  // the trainer only builds the plan; the executors below run it
  Trainer trainer(models::by_name(model), options);
  Plan& plan = trainer.train_plan();
  Tensor images = plan.input("images"), labels = plan.input("labels");
  plan.input("learning_rate").f32()[0] = static_cast<float>(options.learning_rate);
  int64_t fed = 0;
  auto feed = [&] {
    std::copy_n(data.images_of(fed), images.numel(), images.f32());
    std::copy_n(data.labels_of(fed), labels.numel(), labels.i32());
    ++fed;
  };
  std::vector<std::unique_ptr<Executor>> executors;
  for (const Config& c : list) {
    ExecutorOptions e;
    e.policy = parse_policy(c.policy);
    e.threads = c.policy == "serial" ? 1 : o.threads;
    e.inter = c.inter;
    e.intra = c.intra;
    // auto is timed on the schedule its trial settled on: a retrial (after 10 s of steps in
    // training, ExecutorOptions::retrial_seconds) would run serial and narrow stints inside a
    // timed round, and at batch 256 the rounds add up to that.
    e.retrial_seconds = 0.0;
    executors.push_back(std::make_unique<Executor>(plan, e));
    for (int i = 0; i < o.warmup || !executors.back()->tuned(); ++i) feed(), executors.back()->run();
  }
  Result result;
  for (int run = 0; run < o.runs; ++run) {
    result.placement_ns.push_back(placement.probe());
    for (size_t i : bench::run_order(list.size(), run)) {  // another order each round
      auto start = std::chrono::steady_clock::now();
      for (int s = 0; s < o.steps; ++s) feed(), executors[i]->run();
      result.step_seconds[list[i].label].push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / o.steps);
    }
  }
  result.placement_ns.push_back(placement.probe());
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].policy == "auto") {
      ++result.chosen[executors[i]->chosen_schedule()];
      result.schedule_errors = executors[i]->schedule_errors();
      result.held_out_errors = executors[i]->model().held_out_errors();
    }
  return result;
}

std::string percent(const std::vector<double>& errors) {
  return errors.empty() ? std::string("n/a") : cat(bench::fixed(100 * bench::median(errors), 1), "%");
}

}  // namespace

constexpr char kUsage[] =
    "usage: quiver-bench-policies [options]\n"
    "Step time of the executor's policies (serial, intra, fixed pairs, auto) side by side.\n"
    "\n"
    "  --models LIST     comma-separated, of mlp,cnn,lstm (default all three)\n"
    "  --batches LIST    batch sizes (default 16,64,256)\n"
    "  --threads T       threads (default: all available cores)\n"
    "  --warmup N --steps N --runs N   warm-up steps, steps per timed round, rounds (default 40, 50, 5)\n"
    "  --output FILE     also write the table there (atomically)\n";

int main(int argc, char** argv) {
  quiver::bench::line_buffered_output();
  if (quiver::bench::help_requested(argc, argv, kUsage)) return 0;
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const Error& error) {
    std::fprintf(stderr, "quiver-bench-policies: %s\n", error.what());
    return 2;
  }
  quiver::bench::warn_if_oversubscribed("quiver-bench-policies", o.threads);
  const std::vector<Config> list = configs(o.threads);
  std::string header = "| model | batch |";
  std::string rule = "|---|---|";
  for (const Config& c : list) header += cat(" ", c.label, " ms |"), rule += "---|";
  for (const Config& c : list)
    if (c.policy != "intra") header += cat(" ", c.label, " / intra |"), rule += "---|";
  header += " auto chose | model error (schedule) | model error (held-out p) | rounds far apart |\n";
  rule += "---|---|---|---|\n";
  std::string table = header + rule;
  std::printf("# step time by executor policy, %d threads (median of %d rounds of %d steps after %d warm-up steps; "
              "ratio = intra's step time / the policy's, > 1 is faster)\n%s",
              o.threads, o.runs, o.steps, o.warmup, table.c_str());
  std::fflush(stdout);
  std::string notes;  // below the table: the rounds with the cores close together, alone
  try {
    PlacementLog placement;
    for (const std::string& model : o.models)
      for (int64_t batch : o.batches) {
        Result result = measure(model, batch, list, o, placement);
        std::map<std::string, std::vector<double>>& times = result.step_seconds;
        std::vector<double>& schedule = result.schedule_errors;
        std::vector<double>& held_out = result.held_out_errors;
        std::map<std::string, int>& chosen = result.chosen;
        const double intra = bench::median(times["intra"]);
        std::string row = cat("| ", model, " | ", batch, " |");
        for (const Config& c : list) row += cat(" ", bench::fixed(1e3 * bench::median(times[c.label])), " |");
        for (const Config& c : list)
          if (c.policy != "intra")
            row += cat(" ", bench::fixed(intra / bench::median(times[c.label])), " |");
        std::string choices;
        for (const auto& [name, times_chosen] : chosen) choices += cat(choices.empty() ? "" : ", ", name, " x", times_chosen);
        const std::vector<bool> far = bench::far_rounds(placement, result.placement_ns);
        const int far_count = static_cast<int>(std::count(far.begin(), far.end(), true));
        row += cat(" ", choices, " | ", percent(schedule), " | ", percent(held_out), " | ",
                   placement.enabled() ? cat(far_count, " of ", o.runs) : std::string("-"), " |\n");
        table += row;
        std::printf("%s", row.c_str());
        if (far_count > 0 && far_count < o.runs) {
          std::string note = cat("# ", model, " ", batch, ", the ", o.runs - far_count, " rounds with the cores close together:");
          for (const Config& c : list)
            if (c.policy != "intra")
              note += cat(" ", c.label, " / intra ",
                          bench::fixed(bench::median(bench::near_only(times["intra"], far)) /
                                       bench::median(bench::near_only(times[c.label], far))),
                          ";");
          notes += note + "\n";
          std::printf("%s\n", note.c_str());
        }
        std::fflush(stdout);
      }
    notes += cat("# ", placement.summary(), "\n");
    std::printf("# %s\n", placement.summary().c_str());
    if (!o.output.empty()) write_file_atomically(o.output, table + notes, "results");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "quiver-bench-policies: %s\n", error.what());
    return 1;
  }
  return 0;
}
