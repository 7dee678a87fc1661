// quiver-bench-policies: step time of the executor's policies side by side, per model and batch,
// with all cores: serial, intra (TensorFlow's recommended one op at a time on all threads), every
// fixed inter x intra pair with more than one op side by side, and auto (the performance model).
// Each run measures every policy once, in turn, so drift on a shared machine hits all alike; the
// table gives medians over runs and ratios to intra (> 1: faster than intra). It also reports the
// performance model's accuracy per model: the median error of predicted vs measured op times in
// the auto schedule, and at held-out thread counts where there are three or more.
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "core/error.h"
#include "models/models.h"
#include "runtime/atomic_file.h"
#include "runtime/thread_budget.h"
#include "runtime/trainer.h"

namespace {

using namespace quiver;

struct Options {
  std::vector<std::string> models = {"mlp", "cnn", "lstm"};
  std::vector<int64_t> batches = {16, 64, 256};
  int threads = available_cores();
  int warmup = 30, steps = 50, runs = 5;
  std::string output;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) throw Error(cat(flag, ": missing value"));
    std::string value = argv[++i];
    if (flag == "--models") {
      o.models = bench::split(value);
      for (const std::string& m : o.models) models::by_name(m);
    } else if (flag == "--batches") {
      o.batches.clear();
      for (const std::string& b : bench::split(value)) o.batches.push_back(bench::to_int(flag, b));
    } else if (flag == "--threads") {
      o.threads = bench::to_int(flag, value);
    } else if (flag == "--warmup") {
      o.warmup = bench::to_int(flag, value);
    } else if (flag == "--steps") {
      o.steps = bench::to_int(flag, value);
    } else if (flag == "--runs") {
      o.runs = bench::to_int(flag, value);
    } else if (flag == "--output") {
      o.output = value;
    } else {
      throw Error(cat("unknown option '", flag, "' (--models --batches --threads --warmup --steps --runs --output)"));
    }
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

struct Measurement {
  double step_seconds = 0.0;
  std::string chosen;  // auto: the schedule it settled on
  std::vector<double> schedule_errors, held_out_errors;
};

Measurement measure(const std::string& model, int64_t batch, const Config& config, const Options& o,
                    const bench::BatchPool& data) {
  TrainOptions options;
  options.batch = batch;
  options.eval_batch = 1;
  options.threads = config.policy == "serial" ? 1 : o.threads;
  options.policy = config.policy;
  options.inter = config.inter;
  options.intra = config.intra;
  Trainer trainer(models::by_name(model), options);
  int64_t step = 0;
  for (; step < o.warmup; ++step) trainer.train_step(data.images_of(step), data.labels_of(step));
  const Executor* executor = trainer.executor();
  if (config.policy == "auto" && !executor->tuned())
    throw Error(cat("--warmup ", o.warmup, " is shorter than auto's profiling and trials (", executor->tuning_runs_left(),
                    " steps to go)"));
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.steps; ++i, ++step) trainer.train_step(data.images_of(step), data.labels_of(step));
  Measurement m;
  m.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / o.steps;
  if (config.policy == "auto") {
    m.schedule_errors = executor->schedule_errors();
    m.chosen = executor->chosen_schedule();
    m.held_out_errors = executor->model().held_out_errors();
  }
  return m;
}

std::string percent(const std::vector<double>& errors) {
  return errors.empty() ? std::string("n/a") : cat(static_cast<int>(1000 * bench::median(errors)) / 10.0, "%");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const Error& error) {
    std::fprintf(stderr, "quiver-bench-policies: %s\n", error.what());
    return 2;
  }
  const std::vector<Config> list = configs(o.threads);
  std::string header = "| model | batch |";
  std::string rule = "|---|---|";
  for (const Config& c : list) header += cat(" ", c.label, " ms |"), rule += "---|";
  for (const Config& c : list)
    if (c.policy != "intra") header += cat(" ", c.label, " / intra |"), rule += "---|";
  header += " auto chose | model error (schedule) | model error (held-out p) |\n";
  rule += "---|---|---|\n";
  std::string table = header + rule;
  std::printf("# step time by executor policy, %d threads (median of %d runs of %d steps after %d warm-up steps; "
              "ratio = intra's step time / the policy's, > 1 is faster)\n%s",
              o.threads, o.runs, o.steps, o.warmup, table.c_str());
  std::fflush(stdout);
  try {
    for (const std::string& model : o.models)
      for (int64_t batch : o.batches) {
        const bench::BatchPool data(models::by_name(model), batch);
        std::map<std::string, std::vector<double>> times;
        std::vector<double> schedule, held_out;
        std::map<std::string, int> chosen;
        for (int run = 0; run < o.runs; ++run)
          for (const Config& c : list) {
            Measurement m = measure(model, batch, c, o, data);
            times[c.label].push_back(m.step_seconds);
            schedule.insert(schedule.end(), m.schedule_errors.begin(), m.schedule_errors.end());
            held_out.insert(held_out.end(), m.held_out_errors.begin(), m.held_out_errors.end());
            if (!m.chosen.empty()) ++chosen[m.chosen];
          }
        const double intra = bench::median(times["intra"]);
        std::string row = cat("| ", model, " | ", batch, " |");
        for (const Config& c : list) row += cat(" ", static_cast<int>(1e5 * bench::median(times[c.label])) / 100.0, " |");
        for (const Config& c : list)
          if (c.policy != "intra")
            row += cat(" ", static_cast<int>(100 * intra / bench::median(times[c.label])) / 100.0, " |");
        std::string choices;
        for (const auto& [name, times_chosen] : chosen) choices += cat(choices.empty() ? "" : ", ", name, " x", times_chosen);
        row += cat(" ", choices, " | ", percent(schedule), " | ", percent(held_out), " |\n");
        table += row;
        std::printf("%s", row.c_str());
        std::fflush(stdout);
      }
    if (!o.output.empty()) write_file_atomically(o.output, table, "results");
  } catch (const Error& error) {
    std::fprintf(stderr, "quiver-bench-policies: %s\n", error.what());
    return 1;
  }
  return 0;
}
