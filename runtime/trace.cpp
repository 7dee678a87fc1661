#include "runtime/trace.h"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "runtime/atomic_file.h"

namespace quiver {

namespace {

std::string escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char code[8];
      std::snprintf(code, sizeof(code), "\\u%04x", c);
      out += code;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

int trace_thread_index() {
  static std::atomic<int> next{0};
  thread_local int index = next.fetch_add(1);
  return index;
}

int64_t Trace::now_us() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - origin_).count();
}

void Trace::record(TraceEvent event) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(std::move(event));
}

std::vector<TraceEvent> Trace::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

std::string Trace::json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string text = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  std::set<int> learners;
  for (size_t i = 0; i < events_.size(); ++i) {
    const TraceEvent& e = events_[i];
    if (e.learner >= 0) learners.insert(e.learner);
    text += cat(i ? ",\n" : "", "{\"name\":\"", escaped(e.name), "\",\"cat\":\"", escaped(e.op),
                "\",\"ph\":\"X\",\"pid\":", e.learner + 2, ",\"tid\":", e.thread, ",\"ts\":", e.start_us,
                ",\"dur\":", e.duration_us, ",\"args\":{\"op\":\"", escaped(e.op), "\",\"kernel\":\"",
                escaped(e.kernel), "\",\"granted_threads\":", e.granted_threads, ",\"step\":", e.step,
                e.learner >= 0 ? cat(",\"learner\":", e.learner) : std::string(), "}}");
  }
  // With learners, name the process rows (metadata events, "ph":"M").
  if (!learners.empty()) {
    text += cat(events_.empty() ? "" : ",\n",
                "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"training loop\"}}");
    for (int learner : learners)
      text += cat(",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", learner + 2,
                  ",\"args\":{\"name\":\"learner ", learner, "\"}}");
  }
  return text + "\n]}\n";
}

void Trace::write(const std::string& path) const { write_file_atomically(path, json(), "trace"); }

TraceOnError::~TraceOnError() {
  if (trace_ == nullptr || std::uncaught_exceptions() <= uncaught_) return;
  try {
    trace_->write(path_);
  } catch (...) {  // the exception in flight is the one to report
  }
}

}  // namespace quiver
