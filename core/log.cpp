#include "core/log.h"

#include <cstdio>
#include <mutex>

namespace quiver {

namespace {
std::mutex sink_mutex;
WarningSink& sink() {
  static WarningSink installed;
  return installed;
}
}  // namespace

void warn(const std::string& message) {
  std::lock_guard<std::mutex> lock(sink_mutex);
  if (sink())
    sink()(message);
  else
    std::fprintf(stderr, "quiver: warning: %s\n", message.c_str());
}

WarningSink set_warning_sink(WarningSink replacement) {
  std::lock_guard<std::mutex> lock(sink_mutex);
  WarningSink previous = std::move(sink());
  sink() = std::move(replacement);
  return previous;
}

}  // namespace quiver
