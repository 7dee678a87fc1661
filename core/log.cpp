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
void emit(const std::string& message) {  // under sink_mutex
  if (sink())
    sink()(message);
  else
    std::fprintf(stderr, "quiver: warning: %s\n", message.c_str());
}
}  // namespace

void warn(const std::string& message) {
  std::lock_guard<std::mutex> lock(sink_mutex);
  emit(message);
}

void warn_once(const std::string& message) {
  std::lock_guard<std::mutex> lock(sink_mutex);
  if (given_once().insert(message).second) emit(message);
}

WarningSink set_warning_sink(WarningSink replacement) {
  std::lock_guard<std::mutex> lock(sink_mutex);
  WarningSink previous = std::move(sink());
  sink() = std::move(replacement);
  given_once().clear();
  return previous;
}

}  // namespace quiver
