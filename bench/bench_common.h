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

#include "core/error.h"
#include "core/nn.h"
#include "models/models.h"
#include "runtime/thread_budget.h"

namespace quiver::bench {

// A learner configuration as the tables show it: "2 x 1" (learners x threads each) on the CPU,
// "2 streams" on a GPU, where threads do not apply.
inline std::string configuration_cell(int learners, int threads_per_learner, const Device& device) {
  return device.is_cpu() ? cat(learners, " x ", threads_per_learner) : cat(learners, " streams");
}

// True (after printing `usage`) when --help or -h is among the arguments: the program then exits 0.
inline bool help_requested(int argc, char** argv, const char* usage) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::fputs(usage, stdout);
      return true;
    }
  return false;
}

inline std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');) parts.push_back(part);
  return parts;
}

inline int to_int(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    int value = std::stoi(text, &used);
    if (used == text.size() && value > 0) return value;
  } catch (const std::exception&) {
  }
  throw Error(cat(flag, ": expected a positive integer, got '", text, "'"));
}

inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The options the benchmark grids share (models x batches, timed in rounds after a warm-up).
struct GridOptions {
  std::vector<std::string> models = {"mlp", "cnn", "lstm"};
  std::vector<int64_t> batches = {16, 64, 256};
  int threads = available_cores();
  int warmup = 40, steps = 20, runs = 5;
  std::string output;  // markdown table, written atomically
};

// Applies `flag value` when it is one of GridOptions' flags; false when it is not.
inline bool parse_grid_flag(const std::string& flag, const std::string& value, GridOptions& o) {
  if (flag == "--models") {
    o.models = split(value);
    for (const std::string& m : o.models) models::by_name(m);
  } else if (flag == "--batches") {
    o.batches.clear();
    for (const std::string& b : split(value)) o.batches.push_back(to_int(flag, b));
  } else if (flag == "--threads") {
    o.threads = to_int(flag, value);
  } else if (flag == "--warmup") {
    o.warmup = to_int(flag, value);
  } else if (flag == "--steps") {
    o.steps = to_int(flag, value);
  } else if (flag == "--runs") {
    o.runs = to_int(flag, value);
  } else if (flag == "--output") {
    o.output = value;
  } else {
    return false;
  }
  return true;
}

// `pool` batches of uniform pixels and random labels for `spec`, cycled through by step().
struct BatchPool {
  BatchPool(const ModelSpec& spec, int64_t batch, int pool = 64) : batch(batch), pool(pool) {
    features = spec.sample_shape.numel();
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    images.resize(static_cast<size_t>(pool * batch * features));
    labels.resize(static_cast<size_t>(pool * batch));
    for (float& v : images) v = pixel(rng);
    for (int32_t& l : labels) l = static_cast<int32_t>(rng() % 10);
  }
  const float* images_of(int64_t step) const { return images.data() + (step % pool) * batch * features; }
  const int32_t* labels_of(int64_t step) const { return labels.data() + (step % pool) * batch; }
  int64_t batch, features = 0;
  int pool;
  std::vector<float> images;
  std::vector<int32_t> labels;
};

}  // namespace quiver::bench
