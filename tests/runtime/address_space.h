// Caps a test's (child process's) address space, so that the next thread stacks or allocations
// fail where a test wants them to: the error paths of code that starts threads.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace quiver::testing {

// Address space for `more` bytes beyond what the process maps now (VmSize), no more.
inline void limit_address_space_to_now_plus(int64_t more) {
  std::ifstream status("/proc/self/status");
  std::string line;
  int64_t kib = 0;
  while (std::getline(status, line))
    if (line.rfind("VmSize:", 0) == 0) kib = std::stoll(line.substr(7));
  const rlim_t bytes = static_cast<rlim_t>(kib * 1024 + more);
  rlimit limit{bytes, bytes};
  setrlimit(RLIMIT_AS, &limit);
}

}  // namespace quiver::testing
