// Warnings: what a sink that fails does to the code that warns (nothing).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace quiver {
namespace {

static_assert(noexcept(warn(std::string())) && noexcept(warn_once(std::string())),
              "destructors and threads' last steps warn");

TEST(Log, AWarningSinkThatThrowsGoesNoFurtherThanStderr) {
  int calls = 0;
  const WarningSink previous = set_warning_sink([&calls](const std::string&) {
    ++calls;
    throw std::runtime_error("the sink broke");
  });
  testing::internal::CaptureStderr();
  EXPECT_NO_THROW(warn("profiles not cached"));
  EXPECT_NO_THROW(warn_once("ignoring a cache"));
  EXPECT_NO_THROW(warn_once("ignoring a cache"));  // given once, as with a sink that works
  const std::string stderr_text = testing::internal::GetCapturedStderr();
  set_warning_sink(previous);
  EXPECT_EQ(calls, 2);
  EXPECT_NE(stderr_text.find("quiver: warning: profiles not cached\n"), std::string::npos) << stderr_text;
  EXPECT_NE(stderr_text.find("quiver: warning: ignoring a cache\n"), std::string::npos) << stderr_text;
  EXPECT_EQ(stderr_text.find("ignoring a cache", stderr_text.find("ignoring a cache") + 1), std::string::npos)
      << stderr_text;
  EXPECT_NE(stderr_text.find("the warning sink failed"), std::string::npos) << stderr_text;
}

// A sink that warns itself (or calls code that does) would lock the sink's mutex again and hang:
// its own warnings go to stderr.
TEST(Log, ASinkThatWarnsDoesNotHang) {
  std::vector<std::string> kept;
  const WarningSink previous = set_warning_sink([&kept](const std::string& message) {
    kept.push_back(message);
    warn(cat("while keeping '", message, "'"));
    warn_once("once from the sink");
  });
  testing::internal::CaptureStderr();
  warn("outer");
  const std::string stderr_text = testing::internal::GetCapturedStderr();
  set_warning_sink(previous);
  EXPECT_EQ(kept, std::vector<std::string>{"outer"});
  EXPECT_NE(stderr_text.find("quiver: warning: while keeping 'outer'\n"), std::string::npos) << stderr_text;
  EXPECT_NE(stderr_text.find("quiver: warning: once from the sink\n"), std::string::npos) << stderr_text;
}

}  // namespace
}  // namespace quiver
