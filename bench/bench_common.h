// Pieces the benchmarks share: comma lists and positive integers from the command line, medians,
// and a pool of fixed random batches so that no I/O is timed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/nn.h"
#include "models/models.h"
#include "runtime/atomic_file.h"
#include "runtime/placement.h"
#include "runtime/thread_budget.h"

namespace quiver::bench {

// A learner configuration as the tables show it: "2 x 1" (learners x threads each) on the CPU,
// "2 streams" on a GPU, where threads do not apply.
inline std::string configuration_cell(int learners, int threads_per_learner, const Device& device) {
  return device.is_cpu() ? cat(learners, " x ", threads_per_learner) : cat(learners, " streams");
}

// Standard output line by line also into a file or a pipe, so a log keeps every line a killed run
// printed. First thing in every bench's main.
inline void line_buffered_output() { std::setvbuf(stdout, nullptr, _IOLBF, 0); }

// True (after printing `usage`) when --help or -h is among the arguments: the program then exits 0.
inline bool help_requested(int argc, char** argv, const char* usage) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::fputs(usage, stdout);
      return true;
    }
  return false;
}

// `value` rounded to `digits` decimals, trailing zeros kept ("1.00", "0.97"): the tables' ratios
// and times. (Cutting instead of rounding read 0.9699 as 0.96 beside a 0.97 floor.)
inline std::string fixed(double value, int digits = 2) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

// The items of a comma list given to `flag`; an empty list or item is refused, naming the flag.
inline std::vector<std::string> split(const std::string& flag, const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');) {
    if (part.empty()) throw Error(cat(flag, ": empty item in '", text, "'"));
    // A second row or column of the same thing would merge into the first (--learners 2,2).
    if (std::find(parts.begin(), parts.end(), part) != parts.end())
      throw Error(cat(flag, ": '", part, "' is given twice in '", text, "'"));
    parts.push_back(part);
  }
  if (parts.empty() || text.back() == ',') throw Error(cat(flag, ": expected a comma-separated list, got '", text, "'"));
  return parts;
}

// The benches' limits: a batch beyond Fashion-MNIST's training set, or counts past these, is a typo.
constexpr int kMaxBatch = 60000, kMaxCount = 1000000;

// A whole number in [low, high] given to `flag`, or quiver::Error naming it. Read as std::stoll
// reads it (leading blanks and a sign allowed, so '+1' is 1), with nothing after the digits.
inline int64_t to_whole(const std::string& flag, const std::string& text, int64_t high, int64_t low) {
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size() && value >= low && value <= high) return value;
  } catch (const std::exception&) {
  }
  throw Error(cat(flag, ": expected a whole number from ", low, " to ", high, ", got '", text, "'"));
}

// to_whole() for the counts, which are int.
inline int to_int(const std::string& flag, const std::string& text, int high = kMaxCount, int low = 1) {
  return static_cast<int>(to_whole(flag, text, high, low));
}

// The whole numbers of a comma list given to `flag`, each in [low, high]. A number given twice is
// refused by value, not by text (--learners 2,02 would merge two columns as 2,2 would).
inline std::vector<int> int_list(const std::string& flag, const std::string& text, int high = kMaxCount, int low = 1) {
  std::vector<int> values;
  for (const std::string& item : split(flag, text)) {
    const int value = to_int(flag, item, high, low);
    if (std::find(values.begin(), values.end(), value) != values.end())
      throw Error(cat(flag, ": '", item, "' is given twice in '", text, "' (as ", value, ")"));
    values.push_back(value);
  }
  return values;
}

// "on" -> true, "off" -> false given to `flag`, or quiver::Error naming it.
inline bool on_off(const std::string& flag, const std::string& text) {
  if (text != "on" && text != "off") throw Error(cat(flag, ": expected on or off, got '", text, "'"));
  return text == "on";
}

// Runs `parse` (a library parser: a model name, a device), naming `flag` in the error it throws.
template <class Parse>
auto for_flag(const std::string& flag, Parse&& parse) {
  try {
    return parse();
  } catch (const Error& error) {
    throw Error(cat(flag, ": ", error.what()));
  }
}

// A staleness bound runs on CPU learners only (LearnerGroup refuses it elsewhere): refused here
// before any training, naming the flag.
inline void check_staleness_on(const Device& device, bool any_staleness) {
  if (any_staleness && !device.is_cpu())
    throw Error("--staleness: CPU learners only for now (CUDA learners synchronise every round)");
}

// A GPU that is not there (a CPU-only build, no driver, an index past the devices) is named with
// the flag, before any table is printed.
inline void check_device_present(const Device& device) {
  if (!device.is_cpu()) for_flag("--device", [&] { return &backend_for(device); });
}

// The model names given to `flag`, each checked.
inline std::vector<std::string> model_names(const std::string& flag, const std::string& text) {
  std::vector<std::string> names = split(flag, text);
  for (const std::string& name : names) for_flag(flag, [&] { return models::by_name(name); });
  return names;
}

// The order in which run `run` times `count` configurations: run 0 in the given order, later runs
// shuffled with the run as the seed. A configuration timed right after another inherits its idle
// threads and cache footprint; rotating one order would keep every pair of neighbours, so the same
// configuration would pay for the same other one in every run.
inline std::vector<size_t> run_order(size_t count, int run) {
  std::vector<size_t> order(count);
  for (size_t i = 0; i < count; ++i) order[i] = i;
  if (run > 0) {
    std::mt19937 engine(static_cast<std::mt19937::result_type>(run));
    std::shuffle(order.begin(), order.end(), engine);
  }
  return order;
}

inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Rounds timed between hand-off probes (runtime/placement.h): probes[r] was taken before round r
// and probes[r + 1] after it; a round is far when either is (the phase may have changed inside it).
// Nothing is far when the log has nothing to probe.
inline std::vector<bool> far_rounds(const PlacementLog& log, const std::vector<double>& probes) {
  std::vector<bool> far(probes.empty() ? 0 : probes.size() - 1, false);
  if (!log.enabled()) return far;
  for (size_t r = 0; r < far.size(); ++r) far[r] = log.far(probes[r]) || log.far(probes[r + 1]);
  return far;
}

// The values of the rounds that were not far.
inline std::vector<double> near_only(const std::vector<double>& values, const std::vector<bool>& far) {
  std::vector<double> kept;
  for (size_t r = 0; r < values.size(); ++r)
    if (r >= far.size() || !far[r]) kept.push_back(values[r]);
  return kept;
}

// A bench timing more threads than the machine has cores measures the threads taking turns (and
// the auto policy profiles every count up to them first): said once, on stderr, so it is not
// mistaken for the engine's speed. A 16-core run of a 2-core machine's command is fine as it is.
inline void warn_if_oversubscribed(const char* program, int threads) {
  if (threads > available_cores())
    std::fprintf(stderr,
                 "%s: warning: %d threads on %d core(s): they will take turns on the cores, and the timings "
                 "measure that\n",
                 program, threads, available_cores());
}

// The options the benchmark grids share (models x batches, timed in rounds after a warm-up).
struct GridOptions {
  std::vector<std::string> models = {"mlp", "cnn", "lstm"};
  std::vector<int64_t> batches = {16, 64, 256};
  int threads = available_cores();
  int warmup = 40, steps = 20, runs = 5;
  std::string output;  // markdown table, written atomically
};

// An option that `options` (a bench's flags, space-separated, as its usage lists them) does not
// name. Every bench's parser ends in it.
inline Error unknown_option(const std::string& flag, const char* options) {
  return Error(cat("unknown option '", flag, "' (", options, ")"));
}

// The flag of argv[i], written `--flag value` or `--flag=value`.
inline std::string flag_name(const char* arg) {
  const std::string text = arg;
  return text.substr(0, text.find('='));
}

// The value of the flag argv[i]: after its '=', or the next word (i moves past it). A word that
// is no flag, a flag that is not one of `options`, a flag with nothing after it and one followed
// by another option (`--output --no-peer`: the value was forgotten) are each named as such.
inline std::string flag_value(int argc, char** argv, int& i, const char* options) {
  const std::string arg = argv[i], flag = flag_name(argv[i]);
  if (flag.rfind("--", 0) != 0) throw Error(cat("unexpected argument '", arg, "' (see --help)"));
  if (cat(" ", options, " ").find(cat(" ", flag, " ")) == std::string::npos) throw unknown_option(flag, options);
  if (flag.size() < arg.size()) return arg.substr(flag.size() + 1);
  if (i + 1 >= argc) throw Error(cat(flag, ": missing value (see --help)"));
  const std::string value = argv[++i];
  if (value.rfind("--", 0) == 0)
    throw Error(cat(flag, ": missing value (got the option '", value, "'; write ./", value,
                    " for a path that starts with --)"));
  return value;
}

// A switch (a flag without a value) written with one: `--no-peer=1`.
inline void check_no_value(const char* arg) {
  const std::string text = arg, flag = flag_name(arg);
  if (flag.size() < text.size()) throw Error(cat(flag, ": takes no value"));
}

// Applies `flag value` when it is one of GridOptions' flags; false when it is not.
inline bool parse_grid_flag(const std::string& flag, const std::string& value, GridOptions& o) {
  if (flag == "--models") {
    o.models = model_names(flag, value);
  } else if (flag == "--batches") {
    o.batches.clear();
    for (int b : int_list(flag, value, kMaxBatch)) o.batches.push_back(b);
  } else if (flag == "--threads") {
    o.threads = to_int(flag, value, 4096);
  } else if (flag == "--warmup") {
    o.warmup = to_int(flag, value);
  } else if (flag == "--steps") {
    o.steps = to_int(flag, value);
  } else if (flag == "--runs") {
    o.runs = to_int(flag, value);
  } else if (flag == "--output") {
    check_writable(value, flag);
    o.output = value;
  } else {
    return false;
  }
  return true;
}

// Up to `most` batches (fewer for large batches: the pool stays near 64 MiB) of uniform pixels and
// random labels for `spec`, cycled through by images_of() and labels_of().
struct BatchPool {
  BatchPool(const ModelSpec& spec, int64_t batch, int most = 64) : batch(batch) {
    features = spec.sample_shape.numel();
    pool = batches_for(features, batch, most);
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    images.resize(static_cast<size_t>(pool * batch * features));
    labels.resize(static_cast<size_t>(pool * batch));
    for (float& v : images) v = pixel(rng);
    for (int32_t& l : labels) l = static_cast<int32_t>(rng() % 10);
  }
  // How many batches a pool of `batch` samples of `features` values holds, and its bytes.
  static int batches_for(int64_t features, int64_t batch, int most) {
    const int64_t fit = (int64_t{64} << 20) / (batch * features * static_cast<int64_t>(sizeof(float)));
    return static_cast<int>(std::clamp<int64_t>(fit, 2, std::max(2, most)));
  }
  static int64_t bytes_for(const ModelSpec& spec, int64_t batch, int most) {
    const int64_t features = spec.sample_shape.numel();
    return batches_for(features, batch, most) * batch * (features * static_cast<int64_t>(sizeof(float)) + 4);
  }
  const float* images_of(int64_t step) const { return images.data() + (step % pool) * batch * features; }
  const int32_t* labels_of(int64_t step) const { return labels.data() + (step % pool) * batch; }
  int64_t batch, features = 0;
  int pool;
  std::vector<float> images;
  std::vector<int32_t> labels;
};

}  // namespace quiver::bench
