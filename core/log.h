// Warnings the library reports without stopping: an ignored profile cache, a fallback taken.
// They go to stderr as "quiver: warning: ..." unless a sink is installed (tests capture them).
#pragma once

#include <functional>
#include <string>

namespace quiver {

using WarningSink = std::function<void(const std::string&)>;

// Never throws: a sink that throws is reported on stderr with the message (so destructors and
// threads may warn).
void warn(const std::string& message) noexcept;
// warn(), unless this very message was already given since the sink was last set: for warnings
// that every learner's executor would repeat (an ignored profile cache).
void warn_once(const std::string& message) noexcept;
// Installs `sink` (an empty function restores stderr) and returns the previous one. A sink may
// warn (those warnings go to stderr); it must not install another sink.
WarningSink set_warning_sink(WarningSink sink);

}  // namespace quiver
