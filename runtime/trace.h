// Trace: a Chrome trace (Trace Event Format, "X" complete events) of op executions, one event
// per op run with its node, op, kernel, thread, granted threads and step; opens in Perfetto or
// chrome://tracing. Recording is thread-safe, so concurrent executors can share one Trace.
// A learner group's trace puts each learner's ops in a process row of its own ("learner j",
// pid j + 2) and the group's own work (the feeder's hand-over of batches; on a GPU the SMA pass,
// and synchronous SGD's update) in the "training loop" row (pid 1), where a single model's ops go
// too. On the CPU each learner runs its share of the SMA pass ("sma round") on its own threads,
// and under a staleness bound absorbs its own correction ("sma absorb"): both in its own row. A traced plan
// runs eagerly (no CUDA graph replay), so a traced run on a GPU is not a timing reference; there
// an op's event spans its launch on the host, not its kernels' run on the stream (a profiled plan,
// PlanOptions::profile, waits for each op's kernels instead).
// Written atomically (temporary file, then rename): a crash never leaves half a trace.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace quiver {

struct TraceEvent {
  std::string name;    // the node
  std::string op;
  std::string kernel;
  int64_t start_us = 0, duration_us = 0;  // from the Trace's creation
  int thread = 0;      // small per-process thread index (trace_thread_index)
  int granted_threads = 1;
  int64_t step = 0;     // the plan's run, or the learner group's round
  int learner = -1;     // the learner whose op this is; -1: a single model, or the group's own work
};

class Trace {
 public:
  Trace() : origin_(std::chrono::steady_clock::now()) {}
  int64_t now_us() const;
  void record(TraceEvent event);
  std::vector<TraceEvent> events() const;  // a copy, in recording order
  std::string json() const;
  // Throws quiver::Error naming the path when it cannot be written.
  void write(const std::string& path) const;
  // write() at the end of a fit(): a failure is warned about and returned (empty: written), not
  // thrown, so that the training done, its report and a checkpoint saved after it are not lost.
  std::string write_after_training(const std::string& path) const;

 private:
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<TraceEvent> events_;
};

// Writes `trace` to `path` if the scope is left by an exception (a NaN loss, a failing kernel):
// the trace of a run that failed is the one most wanted. A failure to write it is swallowed, so
// the error that is leaving stays the one reported. Declared after the objects whose work must
// be finished before writing (they are destroyed first).
class TraceOnError {
 public:
  TraceOnError(const Trace* trace, std::string path) : trace_(trace), path_(std::move(path)) {}
  ~TraceOnError();
  TraceOnError(const TraceOnError&) = delete;
  TraceOnError& operator=(const TraceOnError&) = delete;

 private:
  const Trace* trace_;
  std::string path_;
  int uncaught_ = std::uncaught_exceptions();
};

// 0, 1, 2, ... in the order threads first ask: readable thread ids for traces and tests.
int trace_thread_index();

}  // namespace quiver
