#include "core/log.h"

#include <cstdio>
#include <mutex>
#include <set>

namespace quiver {

namespace {
std::mutex sink_mutex;
WarningSink& sink() {
  static WarningSink installed;
  return installed;
}
std::set<std::string>& given_once() {  // warn_once()'s messages since the sink was set
  static std::set<std::string> given;
  return given;
}
// Whether this thread is inside the sink: a sink that warns (or logs through code that does)
// would lock sink_mutex again and hang, so its warnings go straight to stderr.
thread_local bool in_sink = false;

bool warned_from_the_sink(const std::string& message) noexcept {
  if (!in_sink) return false;
  std::fprintf(stderr, "quiver: warning: %s\n", message.c_str());
  return true;
}

// Under sink_mutex. A warning never changes what its caller does: a sink that throws (or runs out
// of memory keeping the message) is reported on stderr with the message, and its exception goes
// no further; destructors and threads' last steps warn too, where an exception would end the
// process.
void emit(const std::string& message) noexcept {
  if (sink()) try {
      in_sink = true;
      sink()(message);
      in_sink = false;
      return;
    } catch (...) {
      in_sink = false;
      std::fprintf(stderr, "quiver: the warning sink failed on this warning:\n");
    }
  std::fprintf(stderr, "quiver: warning: %s\n", message.c_str());
}
}  // namespace

void warn(const std::string& message) noexcept {
  if (warned_from_the_sink(message)) return;
  std::lock_guard<std::mutex> lock(sink_mutex);
  emit(message);
}

void warn_once(const std::string& message) noexcept {
  if (warned_from_the_sink(message)) return;
  std::lock_guard<std::mutex> lock(sink_mutex);
  bool first = true;
  try {
    first = given_once().insert(message).second;
  } catch (...) {  // not remembered: given again next time rather than lost
  }
  if (first) emit(message);
}

WarningSink set_warning_sink(WarningSink replacement) {
  std::lock_guard<std::mutex> lock(sink_mutex);
  WarningSink previous = std::move(sink());
  sink() = std::move(replacement);
  given_once().clear();
  return previous;
}

}  // namespace quiver
