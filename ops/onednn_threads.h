// oneDNN on Debian is built with OpenMP. A oneDNN primitive fixes its thread count when it is
// created (from omp_get_max_threads() of the creating thread) and runs its OpenMP regions with
// that many threads on every execution, whatever the width of the executing thread. Quiver runs
// oneDNN single-threaded on slices inside the threads a kernel was granted, so every thread that
// creates or executes oneDNN work first sets its own OpenMP width to one (a per-thread setting)
// for as long as the work lasts, then puts back what it was: the calling thread may be an
// application's, with OpenMP work of its own. tests/runtime/test_executor.cpp
// (OneDnnKernelsStayWithinTheirGrant) checks the width with the OS's per-thread CPU times.
#pragma once

#include <omp.h>

namespace quiver {

class OneDnnOnThisThread {
 public:
  OneDnnOnThisThread() : previous_(omp_get_max_threads()) {
    if (previous_ != 1) omp_set_num_threads(1);
  }
  ~OneDnnOnThisThread() {
    if (previous_ != 1) omp_set_num_threads(previous_);
  }
  OneDnnOnThisThread(const OneDnnOnThisThread&) = delete;
  OneDnnOnThisThread& operator=(const OneDnnOnThisThread&) = delete;

 private:
  int previous_;
};

}  // namespace quiver
