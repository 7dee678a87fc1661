#include "runtime/trace.h"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "runtime/atomic_file.h"

namespace quiver {

namespace {

// The length of the well-formed UTF-8 sequence starting text[i] (1 to 4 bytes), or 0 where the
// bytes there are not one (a stray continuation byte, a truncated or overlong sequence, a
// surrogate, or past U+10FFFF).
size_t utf8_sequence(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return k < text.size() ? static_cast<unsigned char>(text[k]) : 0u; };
  const unsigned lead = byte(i);
  if (lead < 0x80) return 1;
  const auto continuation = [&](size_t k, unsigned low = 0x80, unsigned high = 0xBF) {
    return byte(k) >= low && byte(k) <= high;
  };
  if (lead >= 0xC2 && lead <= 0xDF) return continuation(i + 1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    const unsigned low = lead == 0xE0 ? 0xA0 : 0x80, high = lead == 0xED ? 0x9F : 0xBF;
    return continuation(i + 1, low, high) && continuation(i + 2) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    const unsigned low = lead == 0xF0 ? 0x90 : 0x80, high = lead == 0xF4 ? 0x8F : 0xBF;
    return continuation(i + 1, low, high) && continuation(i + 2) && continuation(i + 3) ? 4 : 0;
  }
  return 0;
}

// `text` as the inside of a JSON string: quotes, backslashes and control characters escaped, and
// bytes that are not UTF-8 (node names are any bytes) written as the characters U+0080-U+00FF
// of the same value, so the file stays valid JSON.
std::string escaped(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    const size_t length = utf8_sequence(text, i);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (length == 0 || static_cast<unsigned char>(c) < 0x20) {
      char code[8];
      std::snprintf(code, sizeof(code), "\\u%04x", static_cast<unsigned char>(c));
      out += code;
    } else {
      out.append(text, i, length);
      i += length;
      continue;
    }
    ++i;
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

std::string Trace::write_after_training(const std::string& path) const {
  try {
    write(path);
    return {};
  } catch (const std::exception& error) {  // also the text of a long run's trace outgrowing memory
    warn(cat("the training is done, but its trace was not written: ", error.what()));
    return error.what();
  }
}

TraceOnError::~TraceOnError() {
  if (trace_ == nullptr || std::uncaught_exceptions() <= uncaught_) return;
  try {
    trace_->write(path_);
  } catch (...) {  // the exception in flight is the one to report
  }
}

}  // namespace quiver
