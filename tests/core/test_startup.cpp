// What a process that never uses a GPU loads: not cuBLAS, which the CUDA backend opens on first
// use (cuda/cublas.h) because loading it costs every process start about a second of CPU time.
// No test of this binary touches a device, so nothing here can have opened it first.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace {

TEST(Startup, ACpuOnlyProcessHasNotLoadedCublas) {
  std::ifstream maps("/proc/self/maps");
  ASSERT_TRUE(maps) << "cannot read /proc/self/maps";
  int lines = 0;
  for (std::string line; std::getline(maps, line); ++lines)
    EXPECT_EQ(line.find("libcublas"), std::string::npos) << line;
  EXPECT_GT(lines, 0);
}

}  // namespace
