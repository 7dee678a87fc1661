// quiver-bench-throughput: training throughput (samples/s) of the bundled models over a grid of
// batch sizes and thread counts, warm-up excluded, median of several runs. When the libtorch peer
// (quiver-torch-peer) was built, each grid point also runs the same model and recipe in libtorch,
// right after Quiver, in the same invocation, and the ratio Quiver/libtorch is printed.
// Data: a pool of 64 fixed random batches (fewer above batch 334) cycled through, so no I/O is timed
// (as in the peer).
// --device cuda[:N]: one model on one CUDA stream, its step replayed as a CUDA graph vs launched
// kernel by kernel (threads and policy do not apply; no peer, the libtorch peer is a CPU build).
// For multi-stream vs single-stream on a GPU, quiver-bench-learners.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
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
using bench::BatchPool;
using bench::median;
using bench::int_list;
using bench::to_int;

struct BenchOptions {
  std::vector<std::string> models = {"mlp", "cnn", "lstm"};
  std::vector<int64_t> batches = {16, 64, 256};
  std::vector<int> threads = {1, 2};
  int warmup = 20, steps = 100, runs = 5;
  double window = 0.0;  // seconds a timed window lasts at least (after `steps` steps)
  std::string output;  // markdown table, written atomically
  std::string peer = QUIVER_TORCH_PEER_PATH;
  bool profile = false;  // print where each grid point's step time goes, by op
  bool windows = false;  // print each timed window's start and end on the steady clock
  bool go_on_stdin = false;  // after each warm-up, wait for a line on standard input before timing
  std::string policy = "auto";  // the executor's policy (auto profiles during the warm-up)
  Device device;
};

constexpr char kOptions[] =
    "--models --batches --threads --warmup --steps --runs --policy --device --output --no-peer --profile --windows --go-on-stdin --window";

BenchOptions parse(int argc, char** argv) {
  BenchOptions o;
  bool threads_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = bench::flag_name(argv[i]);
    if (flag == "--no-peer") {
      bench::check_no_value(argv[i]);
      o.peer.clear();
      continue;
    }
    // The switches, which take no value.
    bool* on = flag == "--profile"       ? &o.profile
               : flag == "--windows"     ? &o.windows
               : flag == "--go-on-stdin" ? &o.go_on_stdin
                                         : nullptr;
    if (on != nullptr) {
      bench::check_no_value(argv[i]);
      *on = true;
      continue;
    }
    std::string value = bench::flag_value(argc, argv, i, kOptions);
    if (flag == "--models") {
      o.models = bench::model_names(flag, value);
    } else if (flag == "--batches") {
      o.batches.clear();
      for (int b : int_list(flag, value, bench::kMaxBatch)) o.batches.push_back(b);
    } else if (flag == "--threads") {
      threads_given = true;
      o.threads.clear();
      for (int t : int_list(flag, value, 4096)) o.threads.push_back(t);
    } else if (flag == "--warmup") {
      o.warmup = to_int(flag, value);
    } else if (flag == "--steps") {
      o.steps = to_int(flag, value);
    } else if (flag == "--runs") {
      o.runs = to_int(flag, value);
    } else if (flag == "--window") {
      o.window = to_int(flag, value, 600000) / 1000.0;
    } else if (flag == "--policy") {
      if (value == "fixed")
        throw Error("--policy fixed: not here (it needs --inter/--intra; quiver-bench-policies finds the best pair)");
      if (value != "auto" && value != "serial" && value != "intra")
        throw Error(cat("--policy: expected auto, serial or intra, got '", value, "'"));
      o.policy = value;
    } else if (flag == "--output") {
      check_writable(value, flag);
      o.output = value;
    } else if (flag == "--device") {
      o.device = bench::for_flag(flag, [&] { return Device::parse(value); });
    } else {
      throw bench::unknown_option(flag, kOptions);
    }
  }
  // On a GPU a model runs on one stream: no thread counts to vary, no CPU peer to compare with.
  if (!o.device.is_cpu()) {
    if (threads_given) throw Error(cat("--threads: not with --device ", o.device.str(), " (a GPU step has no thread count)"));
    o.peer.clear();
    o.threads = {1};
  }
  bench::check_device_present(o.device);
  return o;
}

// Median samples/s of each variant of the training options (same model, batch and threads),
// their runs interleaved so drift on a shared machine hits all alike.
std::vector<double> quiver_samples_per_second(const std::string& model, int64_t batch, int threads,
                                              const BenchOptions& o, const std::vector<bool>& device_graphs) {
  ModelSpec spec = models::by_name(model);
  const BatchPool data(spec, batch);
  std::vector<std::vector<double>> rates(device_graphs.size());
  // --profile: a run of its own first, left out of the rates (a profiled plan reads the clock at
  // every op, and on a GPU runs eagerly and waits for every op).
  for (int run = o.profile ? -1 : 0; run < o.runs; ++run)
    for (size_t variant = 0; variant < device_graphs.size(); ++variant) {
      TrainOptions options;
      options.batch = batch;
      options.threads = threads;
      options.eval_batch = 1;
      options.profile = run < 0;
      options.policy = o.policy;
      options.retrial_seconds = 0.0;  // auto is timed on its trial's schedule (a window may last > 10 s)
      options.device = o.device;
      options.device_graphs = device_graphs[variant];
      Trainer trainer(spec, options);
      auto step = [&](int i) { trainer.train_step(data.images_of(i), data.labels_of(i)); };
      int warmed = 0;
      for (; warmed < o.warmup; ++warmed) step(warmed);
      // auto profiles and tries schedules first: that is warm-up too, never timed.
      while (trainer.executor() && !trainer.executor()->tuned()) step(warmed++);
      if (o.go_on_stdin) {  // another process's window starts with this one (process_pairs.py)
        std::printf("# warmed up\n");
        std::fflush(stdout);
        std::string go;
        if (!std::getline(std::cin, go)) throw Error("--go-on-stdin: standard input ended before the go");
      }
      auto start = std::chrono::steady_clock::now();
      auto end = start;
      int timed = 0;
      do {
        step(warmed + timed++);
        end = std::chrono::steady_clock::now();
      } while (timed < o.steps || std::chrono::duration<double>(end - start).count() < o.window);
      double seconds = std::chrono::duration<double>(end - start).count();
      if (options.profile) {
        std::printf("profile %s batch %lld threads %d (warm-up and timed steps of a run of its own):\n%s",
                    model.c_str(), static_cast<long long>(batch), threads,
                    trainer.train_plan().profile_report(8).c_str());
        continue;
      }
      rates[variant].push_back(timed * batch / seconds);
      if (o.windows) {  // the steady clock is the system's monotonic one: other processes can compare
        auto on_clock = [](std::chrono::steady_clock::time_point t) {
          return std::chrono::duration<double>(t.time_since_epoch()).count();
        };
        std::printf("# timed window: %s batch %lld threads %d run %d: %.6f-%.6f s on the steady clock\n",
                    model.c_str(), static_cast<long long>(batch), threads, run + 1, on_clock(start), on_clock(end));
      }
    }
  std::vector<double> medians;
  for (const std::vector<double>& r : rates) medians.push_back(median(r));
  return medians;
}

// `text` as one word of a /bin/sh command line.
std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// Runs the libtorch peer for one grid point; -1 when it is not built, and -1 with a warning on
// stderr (its last line of output) when it fails: a failure is not shown as a peer never built.
double peer_samples_per_second(const std::string& model, int64_t batch, int threads, const BenchOptions& o) {
  if (o.peer.empty() || !std::filesystem::exists(o.peer)) return -1.0;
  const std::string command = cat(shell_quoted(o.peer), " --model ", model, " --batch ", batch, " --threads ", threads,
                                  " --warmup ", o.warmup, " --steps ", o.steps, " --runs ", o.runs, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return -1.0;
  double rate = -1.0;
  std::string last;
  char line[512];
  while (std::fgets(line, sizeof(line), pipe)) {
    std::string text = line;
    auto at = text.find("median_samples_per_s=");
    if (text.rfind("result", 0) == 0 && at != std::string::npos)
      rate = std::stod(text.substr(at + 21));
    else if (text.find_first_not_of(" \t\r\n") != std::string::npos)
      last = text.substr(0, text.find_last_not_of("\r\n") + 1);
  }
  const int status = pclose(pipe);
  if (status == 0 && rate > 0) return rate;
  std::fprintf(stderr, "quiver-bench-throughput: the libtorch peer failed on %s batch %lld, %d thread(s)%s%s\n",
               model.c_str(), static_cast<long long>(batch), threads, last.empty() ? "" : ": ", last.c_str());
  return -1.0;
}

}  // namespace

constexpr char kUsage[] =
    "usage: quiver-bench-throughput [options]\n"
    "Training samples/s of the bundled models over batch sizes and thread counts, with the libtorch\n"
    "peer side by side when it was built.\n"
    "\n"
    "  --models LIST     comma-separated, of mlp,cnn,lstm (default all three)\n"
    "  --batches LIST    batch sizes (default 16,64,256)\n"
    "  --threads LIST    thread counts (default 1,2)\n"
    "  --policy P        executor policy: auto (default), serial, intra\n"
    "  --device D        cpu (default), cuda or cuda:N (one CUDA stream, CUDA graphs vs eager;\n"
    "                    no peer)\n"
    "  --warmup N --steps N --runs N   warm-up steps, steps per run, runs (default 20, 100, 5)\n"
    "  --no-peer         do not run the libtorch peer\n"
    "  --profile         print where each grid point's step time goes, by op\n"
    "  --windows         print each timed window's start and end on the steady clock (the\n"
    "                    system's monotonic clock; scripts/process_pairs.py checks overlap)\n"
    "  --window MS       a timed window goes on after its --steps until it has lasted MS\n"
    "                    milliseconds (default: exactly --steps steps)\n"
    "  --go-on-stdin     after each warm-up print '# warmed up' and wait for a line on standard\n"
    "                    input before timing (process_pairs.py starts two processes' windows at once)\n"
    "  --output FILE     also write the table there (atomically)\n";

int main(int argc, char** argv) {
  quiver::bench::line_buffered_output();
  if (quiver::bench::help_requested(argc, argv, kUsage)) return 0;
  BenchOptions o;
  try {
    o = parse(argc, argv);
  } catch (const Error& error) {
    std::fprintf(stderr, "quiver-bench-throughput: %s\n", error.what());
    return 2;
  }
  if (o.device.is_cpu())
    quiver::bench::warn_if_oversubscribed("quiver-bench-throughput",
                                          *std::max_element(o.threads.begin(), o.threads.end()));
  bool peer = !o.peer.empty() && std::filesystem::exists(o.peer);
  if (peer && o.window > 0.0) {  // the peer times --steps steps: the two would time different windows
    std::fprintf(stderr, "quiver-bench-throughput: --window: the libtorch peer times --steps steps only; add --no-peer\n");
    return 2;
  }
  const std::string setting =
      o.device.is_cpu() ? cat("policy ", o.policy) : cat("one CUDA stream on ", o.device.str());
  const std::string window = o.window > 0.0 ? cat(" and at least ", static_cast<int>(1000 * o.window + 0.5), " ms") : "";
  std::printf("# training throughput, samples/s (median of %d runs of %d steps%s, %d warm-up steps), %s, %d cores%s\n",
              o.runs, o.steps, window.c_str(), o.warmup, setting.c_str(), available_cores(),
              peer ? ", the libtorch peer after Quiver's runs at each grid point" : ", no libtorch peer");
  auto ratio = [](double a, double b) { return bench::fixed(a / b); };
  // On a GPU: the step replayed as a CUDA graph vs launched kernel by kernel, side by side.
  const bool on_gpu = !o.device.is_cpu();
  std::string table =
      on_gpu ? "| model | batch | CUDA graphs | eager | graphs / eager |\n|---|---|---|---|---|\n"
             : "| model | batch | threads | Quiver | libtorch | Quiver / libtorch |\n|---|---|---|---|---|---|\n";
  std::printf("%s", table.c_str());
  std::fflush(stdout);
  try {
    for (const std::string& model : o.models)
      for (int64_t batch : o.batches)
        for (int threads : o.threads) {
          if (on_gpu) {
            const std::vector<double> rates = quiver_samples_per_second(model, batch, threads, o, {true, false});
            std::string row = cat("| ", model, " | ", batch, " | ", static_cast<int64_t>(rates[0]), " | ",
                                  static_cast<int64_t>(rates[1]), " | ", ratio(rates[0], rates[1]), " |\n");
            table += row;
            std::printf("%s", row.c_str());
            std::fflush(stdout);
            continue;
          }
          double ours = quiver_samples_per_second(model, batch, threads, o, {true})[0];
          double theirs = peer ? peer_samples_per_second(model, batch, threads, o) : -1.0;
          std::string row = theirs > 0 ? cat("| ", model, " | ", batch, " | ", threads, " | ", static_cast<int64_t>(ours),
                                             " | ", static_cast<int64_t>(theirs), " | ", ratio(ours, theirs), " |\n")
                                       : cat("| ", model, " | ", batch, " | ", threads, " | ",
                                             static_cast<int64_t>(ours), " | - | - |\n");
          table += row;
          std::printf("%s", row.c_str());
          std::fflush(stdout);
        }
    if (!o.output.empty()) write_file_atomically(o.output, table, "results");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "quiver-bench-throughput: %s\n", error.what());
    return 1;
  }
  return 0;
}
