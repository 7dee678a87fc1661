// Warnings (core/log.h's warn()) collected instead of printed while one of these lives: a test
// checks what was said, and how often.
#pragma once

#include <string>
#include <vector>

#include "core/log.h"

namespace quiver::test {

struct CapturedWarnings {
  CapturedWarnings() {
    previous = set_warning_sink([this](const std::string& message) { messages.push_back(message); });
  }
  ~CapturedWarnings() { set_warning_sink(previous); }
  CapturedWarnings(const CapturedWarnings&) = delete;
  CapturedWarnings& operator=(const CapturedWarnings&) = delete;
  std::vector<std::string> messages;
  WarningSink previous;
};

}  // namespace quiver::test
