// PerfModel: how long an op takes as a function of the threads it is granted (DESIGN.md section 3,
// "Concurrency control"). Ops are keyed by kind, kernel, input shapes and attributes, so equal
// ops share one profile. Timings per key and thread count are collected while the first steps
// run; a small model T(p) is fitted to their medians:
//   one measured count:   T(p) = a
//   two measured counts:  T(p) = a + b/p                 (Amdahl: serial part + parallel part)
//   three or more:        T(p) = a + b/p + c*p           (c: the cost of each extra thread)
// weighted so every point counts by its relative error. The grant of an op is the fewest threads
// whose predicted time is within a tolerance of the best. Profiles persist in a cache file keyed
// by CPU model; a corrupt, foreign or stale file is ignored with a warning.
// What it is not: a model of interference between co-running ops (measured, not predicted).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/graph.h"

namespace quiver {

// "conv2d/onednn [64,1,28,28][16,1,5,5] padding=2,stride=1": what an op's time depends on.
std::string op_key(const Graph& graph, const Node& node, const std::string& kernel);

double median_of(std::vector<double> values);

struct ThreadFit {
  double a = 0.0, b = 0.0, c = 0.0;  // T(p) = a + b/p + c*p, in seconds
  double predict(int threads) const;
};

// Least-squares fit of T(p) to (threads, seconds) points, relative error, form by point count: the
// full form where it stays finite and at least half the shortest time measured at every p up to
// `up_to` (and the largest count measured), else a + b/p under the same test, else the mean.
ThreadFit fit_thread_curve(const std::vector<std::pair<int, double>>& points, int up_to = 0);

class PerfModel {
 public:
  // The most threads a model describes, and a cache holds timings for.
  static constexpr int kMostThreads = 65536;

  explicit PerfModel(int max_threads);  // 1..kMostThreads
  int max_threads() const { return max_threads_; }
  // Thread counts profiled: every count up to 8, then a doubling series, then max_threads itself.
  const std::vector<int>& profiled_counts() const { return counts_; }

  void add_sample(const std::string& key, int threads, double seconds);
  // The samples of `key` at `threads` become `seconds`: fresher timings of the same op replace
  // old ones (a cache measured while the host was busy, or a host that changed). fit() before
  // predicting again.
  void replace_samples(const std::string& key, int threads, std::vector<double> seconds);
  // Samples of `key` at `threads`.
  int samples(const std::string& key, int threads) const;
  // Every profiled count has at least `per_count` samples (a cached median counts as enough).
  bool complete(const std::string& key, int per_count) const;
  // Fits every key from the medians of its samples.
  void fit();
  double predict(const std::string& key, int threads) const;
  // The fewest threads predicted within (1 + tolerance) x, or `slack` seconds of, the best.
  int grant(const std::string& key, double tolerance, double slack = 0.0) const;
  int fastest(const std::string& key) const;                   // the p of the best prediction
  double measured(const std::string& key, int threads) const;  // median sample, -1 when none

  // Accuracy at thread counts not used for fitting: for each key measured at three or more
  // counts, leave each count out in turn, refit on the rest and collect |pred - measured| /
  // measured. Empty when no key has three counts (a 2-core machine).
  std::vector<double> held_out_errors() const;

  // The CPU model as /proc/cpuinfo names it (cpu_model_of; "unknown" when it cannot be read).
  static std::string cpu_model();
  // The build type (and sanitizers) this library was built as: profiles timed under another are
  // stale here.
  static std::string build_flavor();
  // Loads `path`. Returns false, changing nothing, when the file does not exist (silently) or is
  // corrupt, from another CPU or another count of cores to run on (available_cores()), or from
  // another format or Quiver version (with a warning).
  bool load(const std::string& path);
  // Writes every key's medians to `path` atomically (creating its directory), merged with what
  // the file holds by then (another process may have saved since this one loaded it): the file's
  // timings stand for every op and thread count this process only loaded, or measured before its
  // last save (another process may have refreshed them since), this process's for those it
  // measured after. Throws quiver::Error, replacing nothing, when `path` exists and is not a
  // profile cache. Saves of one cache take turns (a lock on its directory); a save that waits
  // longer than `lock_wait_s` for another (a process stopped while saving, a stuck network file
  // system) throws quiver::Error, writing nothing, instead of hanging the run that saves.
  void save(const std::string& path, double lock_wait_s = 10.0);
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::map<int, std::vector<double>> samples;  // threads -> seconds
    std::set<int> measured;  // thread counts this process timed (add/replace_samples) since its last save
    ThreadFit fit;
    bool fitted = false;
  };
  const Entry& entry(const std::string& key) const;
  bool read(const std::string& path, bool quiet);  // load(), with or without its warnings
  int max_threads_;
  std::vector<int> counts_;
  std::map<std::string, Entry> entries_;
};

// Where quiver-train keeps profiles: $QUIVER_PROFILE_CACHE, else $XDG_CACHE_HOME/quiver or
// ~/.cache/quiver, file profiles-<cpu>-<N>cores-<build type>.json (cpu_file_tag of this CPU's
// model, available_cores(), and cpu_file_tag of PerfModel::build_flavor(), "unknown" without a
// CMAKE_BUILD_TYPE: hosts of different CPUs or sizes sharing one home directory, and debug and
// release builds, keep a file each instead of overwriting one); "" when none of these is set.
std::string default_profile_cache();
// A CPU model name as a file-name part: lower-case letters and digits, other runs as one '-', at
// most 64 characters ("AMD EPYC 9R14 96-Core Processor" -> "amd-epyc-9r14-96-core-processor").
std::string cpu_file_tag(const std::string& cpu);
// The CPU model named by the text of a /proc/cpuinfo: x86's "model name"; on 64-bit ARM, which has
// none, each distinct core design by implementer, part, variant and revision (two for big.LITTLE);
// POWER's "cpu", RISC-V's "uarch"; "unknown" when none of these is there.
std::string cpu_model_of(const std::string& cpuinfo);

}  // namespace quiver
