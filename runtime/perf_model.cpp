#include "runtime/perf_model.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "runtime/atomic_file.h"
#include "runtime/json_text.h"
#include "runtime/thread_budget.h"

namespace quiver {

namespace {

constexpr const char* kCacheFormat = "quiver-profile-cache";
// 2: the header names the cores the profiling process could run on ("cores"), which version 1
// did not.
constexpr int kCacheVersion = 2;
#ifndef QUIVER_BUILD_FLAVOR
#define QUIVER_BUILD_FLAVOR "unknown"
#endif
// The kernels' version and the build's type: timings cached by other kernels, or by a debug or
// sanitizer build, are stale. Bump the number when a kernel's speed changes (0.2: Adam's bias
// corrections hoisted out of the per-element loop; 0.3: GEMM column cuts, the LSTM's one parallel
// region, conv scratchpads, branchless max-pool). A stale profile that slipped through heals
// itself anyway (ExecutorOptions::refresh_steps).
constexpr const char* kQuiverVersion = "0.3 " QUIVER_BUILD_FLAVOR;
constexpr std::uintmax_t kLargestCache = std::uintmax_t{64} << 20;  // a cache is a few KB of JSON
constexpr double kShortest = 1e-7;  // predictions never fall below 0.1 us
// What a cache may hold: per-op times from 1 ns to 1000 s (and thread counts up to
// PerfModel::kMostThreads).
constexpr double kShortestCached = 1e-9, kLongestCached = 1e3;

// Weighted least squares of y = sum_j x_j * basis_j(p), weights 1/t (relative error).
// Returns false when the normal equations are singular.
bool least_squares(const std::vector<std::pair<int, double>>& points, int terms, double* solution) {
  double normal[3][4] = {};
  for (const auto& [threads, seconds] : points) {
    const double p = threads, w = 1.0 / seconds;
    const double row[3] = {w, w / p, w * p};
    for (int i = 0; i < terms; ++i) {
      for (int j = 0; j < terms; ++j) normal[i][j] += row[i] * row[j];
      normal[i][3] += row[i] * (seconds * w);
    }
  }
  // Singular relative to the matrix's own scale (which goes as 1/t^2): the same points in
  // microseconds or in hours fit alike.
  double scale = 0.0;
  for (int i = 0; i < terms; ++i)
    for (int j = 0; j < terms; ++j) scale = std::max(scale, std::abs(normal[i][j]));
  for (int column = 0; column < terms; ++column) {
    int pivot = column;
    for (int r = column + 1; r < terms; ++r)
      if (std::abs(normal[r][column]) > std::abs(normal[pivot][column])) pivot = r;
    if (!(std::abs(normal[pivot][column]) > 1e-12 * scale)) return false;
    for (int k = 0; k < 4; ++k) std::swap(normal[column][k], normal[pivot][k]);
    for (int r = 0; r < terms; ++r) {
      if (r == column) continue;
      const double factor = normal[r][column] / normal[column][column];
      for (int k = column; k < 4; ++k) normal[r][k] -= factor * normal[column][k];
    }
  }
  for (int i = 0; i < terms; ++i) solution[i] = normal[i][3] / normal[i][i];
  return true;
}

}  // namespace

std::string op_key(const Graph& graph, const Node& node, const std::string& kernel) {
  std::string key = node.op + "/" + kernel + " ";
  for (ValueId input : node.inputs) key += graph.value(input).shape.str();
  return key + " " + node.attrs.str();
}

double median_of(std::vector<double> values) {
  if (values.empty()) return -1.0;
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

double ThreadFit::predict(int threads) const {
  const double p = threads;
  return std::max(kShortest, a + b / p + c * p);
}

ThreadFit fit_thread_curve(const std::vector<std::pair<int, double>>& points, int up_to) {
  ThreadFit fit;
  if (points.empty()) return fit;
  // A NaN time fitted a NaN curve whose predictions read as the shortest time everywhere; a
  // count of 0 threads divides by it.
  for (auto [threads, seconds] : points)
    if (threads < 1 || threads > PerfModel::kMostThreads || !std::isfinite(seconds) || seconds < 0.0)
      throw Error(cat("performance model: cannot fit a point of ", seconds, " s at ", threads,
                      " threads (threads in [1, ", PerfModel::kMostThreads, "], a finite time >= 0)"));
  std::vector<std::pair<int, double>> positive;
  int largest = 1;
  double shortest = std::numeric_limits<double>::infinity();
  for (auto [threads, seconds] : points) {
    positive.push_back({threads, std::max(seconds, kShortest)});
    largest = std::max(largest, threads);
    shortest = std::min(shortest, std::max(seconds, kShortest));
  }
  if (positive.size() == 1) {
    fit.a = positive[0].second;
    return fit;
  }
  double x[3] = {};
  // A fit is used at every thread count up to `up_to`, measured or not: it must be finite there
  // and never claim the op runs in under half the shortest time measured (between measured
  // counts a + b/p + c*p with a < 0 can dip to zero and below, and made 10-13 threads look free).
  auto plausible = [&](const ThreadFit& candidate) {
    if (!std::isfinite(candidate.a) || !std::isfinite(candidate.b) || !std::isfinite(candidate.c)) return false;
    for (int p = 1; p <= std::max(up_to, largest); ++p)
      if (!(candidate.a + candidate.b / p + candidate.c * p >= 0.5 * shortest)) return false;
    return true;
  };
  if (positive.size() >= 3 && least_squares(positive, 3, x)) {
    ThreadFit full{x[0], x[1], x[2]};
    if (plausible(full)) return full;
  }
  if (least_squares(positive, 2, x)) {
    ThreadFit amdahl{x[0], x[1], 0.0};
    if (plausible(amdahl)) return amdahl;
  }
  double sum = 0.0;  // degenerate points: the mean time
  for (auto [threads, seconds] : positive) sum += seconds;
  fit.a = sum / static_cast<double>(positive.size());
  return fit;
}

PerfModel::PerfModel(int max_threads) : max_threads_(max_threads) {
  if (max_threads < 1 || max_threads > kMostThreads)
    throw Error(cat("performance model: max threads must be in [1, ", kMostThreads, "], got ", max_threads));
  for (int p = 1; p <= max_threads; p = p < 8 ? p + 1 : p * 2) counts_.push_back(p);
  if (counts_.back() != max_threads) counts_.push_back(max_threads);
}

namespace {

// A sample the cache could hold: a thread count the model knows, a time that is a time (a NaN
// would reach the median's sort, and save() would write what load() refuses for the whole file).
void check_sample(const std::string& key, int threads, double seconds) {
  if (threads < 1 || threads > PerfModel::kMostThreads || !std::isfinite(seconds) || seconds < 0.0)
    throw Error(cat("perf model: a sample of '", key, "' at ", threads, " threads of ", seconds,
                    " s (threads in [1, ", PerfModel::kMostThreads, "], a finite time >= 0)"));
}

}  // namespace

void PerfModel::add_sample(const std::string& key, int threads, double seconds) {
  check_sample(key, threads, seconds);
  Entry& entry = entries_[key];
  // A clock coarser than the op reads 0: kept as the shortest time a cache holds, so the fit and
  // the error reports stay finite and save() writes nothing load() would refuse.
  entry.samples[threads].push_back(std::max(seconds, kShortestCached));
  entry.measured.insert(threads);
  entry.fitted = false;
}

void PerfModel::replace_samples(const std::string& key, int threads, std::vector<double> seconds) {
  if (seconds.empty()) throw Error(cat("perf model: no samples to replace those of '", key, "' at ", threads, " threads"));
  for (double time : seconds) check_sample(key, threads, time);
  Entry& entry = entries_[key];
  for (double& time : seconds) time = std::max(time, kShortestCached);
  entry.samples[threads] = std::move(seconds);
  entry.measured.insert(threads);
  entry.fitted = false;
}

int PerfModel::samples(const std::string& key, int threads) const {
  auto found = entries_.find(key);
  if (found == entries_.end()) return 0;
  auto at = found->second.samples.find(threads);
  return at == found->second.samples.end() ? 0 : static_cast<int>(at->second.size());
}

bool PerfModel::complete(const std::string& key, int per_count) const {
  for (int p : counts_)
    if (samples(key, p) < per_count) return false;
  return true;
}

void PerfModel::fit() {
  for (auto& [key, entry] : entries_) {
    std::vector<std::pair<int, double>> points;
    for (const auto& [threads, seconds] : entry.samples) points.push_back({threads, median_of(seconds)});
    entry.fit = fit_thread_curve(points, max_threads_);
    entry.fitted = true;
  }
}

const PerfModel::Entry& PerfModel::entry(const std::string& key) const {
  auto found = entries_.find(key);
  if (found == entries_.end() || !found->second.fitted)
    throw Error(cat("performance model: no fitted profile for '", key, "'"));
  return found->second;
}

double PerfModel::predict(const std::string& key, int threads) const {
  if (threads < 1 || threads > max_threads_)
    throw Error(cat("performance model: a prediction of '", key, "' at ", threads, " threads (this model: 1..",
                    max_threads_, ")"));
  return entry(key).fit.predict(threads);
}

int PerfModel::fastest(const std::string& key) const {
  const ThreadFit& fit = entry(key).fit;
  int best = 1;
  // The fewest threads at the best time: a flat curve's predictions differ by rounding only (an
  // op that does not scale could be spread over every thread when it ran alone). The margin is
  // far above the fit's rounding, which grows with the thread counts, and far below a real gain.
  for (int p = 2; p <= max_threads_; ++p)
    if (fit.predict(p) < fit.predict(best) * (1.0 - 1e-6)) best = p;
  return best;
}

int PerfModel::grant(const std::string& key, double tolerance, double slack) const {
  const ThreadFit& fit = entry(key).fit;
  const double best = fit.predict(fastest(key));
  const double target = std::max(best * (1.0 + tolerance), best + slack);
  for (int p = 1; p <= max_threads_; ++p)
    if (fit.predict(p) <= target) return p;
  return max_threads_;
}

double PerfModel::measured(const std::string& key, int threads) const {
  auto found = entries_.find(key);
  if (found == entries_.end()) return -1.0;
  auto at = found->second.samples.find(threads);
  return at == found->second.samples.end() ? -1.0 : median_of(at->second);
}

std::vector<double> PerfModel::held_out_errors() const {
  std::vector<double> errors;
  for (const auto& [key, entry] : entries_) {
    std::vector<std::pair<int, double>> points;
    for (const auto& [threads, seconds] : entry.samples) points.push_back({threads, median_of(seconds)});
    if (points.size() < 3) continue;
    for (size_t left_out = 0; left_out < points.size(); ++left_out) {
      std::vector<std::pair<int, double>> rest = points;
      rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(left_out));
      const auto [threads, seconds] = points[left_out];
      errors.push_back(std::abs(fit_thread_curve(rest, max_threads_).predict(threads) - seconds) / seconds);
    }
  }
  return errors;
}

std::string PerfModel::cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  return cpu_model_of(text.str());
}

// x86 names its CPU in "model name". 64-bit ARM kernels give only numbers, one block per core:
// the implementer, part, variant and revision identify the core design, and a big.LITTLE chip
// lists two designs, so every distinct one is named. POWER names it in "cpu", RISC-V in "uarch".
std::string cpu_model_of(const std::string& cpuinfo) {
  auto value_of = [](const std::string& line) {
    std::string value = line.substr(line.find(':') + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t\r") + 1);
    return value;
  };
  auto key_of = [](const std::string& line) {
    std::string key = line.substr(0, line.find(':'));
    key.erase(key.find_last_not_of(" \t") + 1);
    return key;
  };
  std::istringstream in(cpuinfo);
  std::string line, other_name;
  std::map<std::string, std::string> core;  // this block's ARM fields
  std::vector<std::string> arm_designs;
  auto end_block = [&] {
    if (core.count("CPU part")) {
      const std::string design = cat("ARM implementer ", core["CPU implementer"], " part ", core["CPU part"],
                                     " variant ", core["CPU variant"], " revision ", core["CPU revision"]);
      if (std::find(arm_designs.begin(), arm_designs.end(), design) == arm_designs.end())
        arm_designs.push_back(design);
    }
    core.clear();
  };
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      end_block();
      continue;
    }
    if (line.find(':') == std::string::npos) continue;
    const std::string key = key_of(line), value = value_of(line);
    if (key == "model name" && !value.empty()) return value;
    if (key.rfind("CPU ", 0) == 0) core[key] = value;
    if ((key == "cpu" || key == "uarch") && other_name.empty() && !value.empty()) other_name = value;
  }
  end_block();
  if (!arm_designs.empty()) {
    std::string name = arm_designs[0];
    for (size_t i = 1; i < arm_designs.size(); ++i) name += " + " + arm_designs[i];
    return name;
  }
  return other_name.empty() ? "unknown" : other_name;
}

namespace {

// The text of the file at `path` when it is a regular file of at most kLargestCache bytes (so a
// device like /dev/zero is never read for ever) that can be read, else nothing and `why` says why.
std::optional<std::string> cache_text(const std::string& path, std::string* why = nullptr) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error) || std::filesystem::file_size(path, error) > kLargestCache) {
    if (why) *why = "not a regular file of at most 64 MiB";
    return std::nullopt;
  }
  std::ifstream in(path);
  if (!in) {
    if (why) *why = cat("cannot be read (", std::strerror(errno), ")");
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool holds_profile_cache(const std::string& path, std::string* why);  // below, with save()

}  // namespace

bool PerfModel::load(const std::string& path) { return read(path, /*quiet=*/false); }

bool PerfModel::read(const std::string& path, bool quiet) {
  const auto warn = [quiet](const std::string& message) {
    if (!quiet) warn_once(message);
  };
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return false;  // no cache yet: profile and write one
  std::string why;
  const std::optional<std::string> text = cache_text(path, &why);
  if (!text) {
    warn(cat("ignoring profile cache '", path, "': ", why, "; ops will be profiled again"));
    return false;
  }
  std::map<std::string, Entry> loaded;
  try {
    nlohmann::json cache = nlohmann::json::parse(*text);
    if (!cache.is_object() || cache.value("format", "") != kCacheFormat)
      throw std::runtime_error("not a Quiver profile cache");
    if (cache.at("version").get<int>() != kCacheVersion || cache.at("quiver").get<std::string>() != kQuiverVersion) {
      warn(cat("ignoring stale profile cache '", path, "' (format ", json_for_message(cache.at("version")), ", Quiver ",
               cache.contains("quiver") ? json_for_message(cache["quiver"]) : "unnamed", "; this is format ", kCacheVersion,
               ", Quiver ", kQuiverVersion,
               "); ops will be profiled again"));
      return false;
    }
    const std::string cpu = cache.at("cpu").get<std::string>();
    if (cpu != cpu_model()) {
      warn(cat("ignoring profile cache '", path, "': it was measured on '", cpu, "', this CPU is '", cpu_model(),
               "'; ops will be profiled again"));
      return false;
    }
    // The same CPU model with other cores to run on (a VM of another size, a taskset, a cgroup's
    // cpuset) times an op at the same thread count on other cores: two vCPUs that are one core's
    // hyperthreads, against two cores of a larger host.
    const nlohmann::json& cores_entry = cache.at("cores");
    if (!cores_entry.is_number_integer()) throw std::runtime_error("its count of cores is not a whole number");
    const int64_t cores = cores_entry.get<int64_t>();
    if (cores != available_cores()) {
      warn(cat("ignoring profile cache '", path, "': it was measured with ", cores, " cores to run on, this process has ",
               available_cores(), "; ops will be profiled again"));
      return false;
    }
    for (const auto& [key, op] : cache.at("ops").items()) {
      const nlohmann::json& threads = op.at("threads");
      const nlohmann::json& seconds = op.at("median_s");
      if (!threads.is_array() || !seconds.is_array() || threads.size() != seconds.size() || threads.empty())
        throw std::runtime_error(cat("op '", key, "' has ", threads.size(), " thread counts and ", seconds.size(), " times"));
      for (size_t i = 0; i < threads.size(); ++i) {
        // Whole thread counts a machine can have, and times an op of a training step can take.
        const bool count_ok = threads[i].is_number_integer() && threads[i].get<int64_t>() >= 1 &&
                              threads[i].get<int64_t>() <= PerfModel::kMostThreads;
        const bool time_ok = seconds[i].is_number() && seconds[i].get<double>() >= kShortestCached &&
                             seconds[i].get<double>() <= kLongestCached;
        if (!count_ok || !time_ok)
          throw std::runtime_error(cat("op '", key, "' has an invalid entry (", json_for_message(threads[i]), " threads, ",
                                       json_for_message(seconds[i]), " s)"));
        loaded[key].samples[threads[i].get<int>()].push_back(seconds[i].get<double>());
      }
    }
  } catch (const std::exception& error) {
    // A file given by mistake (another JSON document, notes) is no corrupt cache: save() will not
    // write over it either, which the warning says now rather than at the first save.
    std::string not_ours;
    if (!holds_profile_cache(path, &not_ours))
      warn(cat("ignoring '", path, "' as a profile cache: ", not_ours,
               " (it is left as it is, and no profiles are cached in it); ops will be profiled again"));
    else
      warn(cat("ignoring corrupt profile cache '", path, "': ", error.what(), "; ops will be profiled again"));
    return false;
  }
  for (auto& [key, entry] : loaded) entries_[key] = std::move(entry);
  fit();
  return true;
}

namespace {

// An exclusive flock on a directory while alive; nothing when the directory cannot be opened (the
// write that follows then fails with its own message) or cannot be locked (a file system without
// locks). Waits at most `wait_s` for another holder, then throws quiver::Error.
class DirectoryLock {
 public:
  DirectoryLock(const std::filesystem::path& directory, double wait_s)
      : fd_(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (fd_ < 0) return;
    using Clock = std::chrono::steady_clock;
    // At most a year: longer (or infinite) would overflow the clock's nanoseconds into the past;
    // NaN or negative: no wait.
    const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(wait_s > 0.0 ? std::min(wait_s, 3.2e7) : 0.0));
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) return;  // no locks here: write without one, as before
      if (Clock::now() >= deadline) {
        ::close(fd_);
        throw Error(cat("the directory '", directory.string(), "' stayed locked by another save for ", wait_s,
                        " s (a process stopped while saving its profiles?)"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ~DirectoryLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_;
};

// Whether `path` may hold a profile cache, however stale or corrupt: a JSON object whose format is
// ours, an empty file, or text that does not parse but names our format (a cache cut short). save()
// replaces only such a file (or none): not another JSON document (one with comments or a trailing
// comma does not parse either), nor a file that is no JSON.
// Otherwise `why` says what it is: not a profile cache, or a file that cannot be read.
bool holds_profile_cache(const std::string& path, std::string* why) {
  const std::optional<std::string> text = cache_text(path, why);
  if (!text) return false;
  const std::string& contents = *text;
  const nlohmann::json cache = nlohmann::json::parse(contents, nullptr, false);  // no exceptions
  bool ours = false;
  if (cache.is_discarded()) {  // empty, or a cache cut short; not some other text
    const size_t first = contents.find_first_not_of(" \t\r\n");
    ours = first == std::string::npos ||
           (contents[first] == '{' && contents.find(cat("\"", kCacheFormat, "\"")) != std::string::npos);
  } else {
    ours = cache.is_object() && cache.contains("format") && cache["format"].is_string() &&
           cache["format"].get<std::string>() == kCacheFormat;
  }
  if (!ours) *why = "not a profile cache";
  return ours;
}

}  // namespace

void PerfModel::save(const std::string& path, double lock_wait_s) {
  // A file given by mistake (a checkpoint, notes) was ignored by load() with a warning; it is not
  // replaced either.
  std::error_code exists_error;
  std::string why;
  if (std::filesystem::exists(path, exists_error) && !holds_profile_cache(path, &why))
    throw Error(cat("profile cache '", path, "' is left as it is: ", why, " (remove it, or choose another ",
                    "file for the cache)"));
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  // Two processes profiling into one cache (trainings side by side) would each write what it had
  // loaded plus its own keys, dropping the other's, or putting back an op's old timings over those
  // the other refreshed, or dropping the thread counts only a wider run measured. Under a lock on
  // the cache's directory, the file as it is now is the base, and only the timings this process
  // measured replace its own; what this process only loaded fills in what the file lacks. The
  // lock is on the directory the write lands in: two processes that reach one cache through
  // different links must take the same lock.
  const std::filesystem::path written_in = std::filesystem::path(atomic_write_target(path, "profile cache")).parent_path();
  const DirectoryLock lock(written_in.empty() ? std::filesystem::path(".") : written_in, lock_wait_s);
  std::map<std::string, Entry> merged;
  PerfModel on_disk(max_threads_);
  if (on_disk.read(path, /*quiet=*/true)) merged = std::move(on_disk.entries_);
  for (const auto& [key, entry] : entries_) {
    Entry& into = merged[key];
    for (const auto& [p, times] : entry.samples)
      if (entry.measured.count(p) > 0 || into.samples.count(p) == 0) into.samples[p] = times;
  }
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [key, entry] : merged) {
    std::vector<int> threads;
    std::vector<double> seconds;
    for (const auto& [p, times] : entry.samples)
      threads.push_back(p), seconds.push_back(std::clamp(median_of(times), kShortestCached, kLongestCached));
    ops[key] = {{"threads", threads}, {"median_s", seconds}};
  }
  nlohmann::json cache = {{"format", kCacheFormat}, {"version", kCacheVersion}, {"quiver", kQuiverVersion},
                          {"cpu", cpu_model()}, {"cores", available_cores()}, {"ops", ops}};
  write_file_atomically(path, cache.dump(1) + "\n", "profile cache");
  // In the file now: from here on another process's refresh of them stands over these timings.
  for (auto& [key, entry] : entries_) entry.measured.clear();
}

std::string PerfModel::build_flavor() { return QUIVER_BUILD_FLAVOR; }

std::string default_profile_cache() {
  if (const char* explicit_path = std::getenv("QUIVER_PROFILE_CACHE")) return explicit_path;
  std::string directory;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    directory = std::string(xdg) + "/quiver";
  else if (const char* home = std::getenv("HOME"); home && *home)
    directory = std::string(home) + "/.cache/quiver";
  else
    return "";
  // One file per CPU model and build type: a debug or sanitizer build's profiles are stale to a
  // release build, and a shared file would be replaced each time the other ran.
  // One per count of cores too, so hosts of one CPU model and different sizes keep theirs.
  return cat(directory, "/profiles-", cpu_file_tag(PerfModel::cpu_model()), "-", available_cores(), "cores-",
             cpu_file_tag(PerfModel::build_flavor()), ".json");
}

std::string cpu_file_tag(const std::string& cpu) {
  std::string tag;
  for (char c : cpu) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u))
      tag += static_cast<char>(std::tolower(u));
    else if (!tag.empty() && tag.back() != '-')
      tag += '-';
  }
  if (tag.size() > 64) tag.resize(64);
  while (!tag.empty() && tag.back() == '-') tag.pop_back();  // also where the cut fell after a '-'
  return tag.empty() ? "unknown" : tag;
}

}  // namespace quiver
