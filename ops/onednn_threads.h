// oneDNN on Debian is built with OpenMP. A oneDNN primitive fixes its thread count when it is
// created (from omp_get_max_threads() of the creating thread) and runs its OpenMP regions with
// that many threads on every execution, whatever the width of the executing thread. Quiver runs
// oneDNN single-threaded on slices inside the threads a kernel was granted, so every thread that
// creates or executes oneDNN work first sets its own OpenMP width to one (a per-thread setting).
// tests/runtime/test_executor.cpp (OneDnnKernelsStayWithinTheirGrant) checks it with the OS's
// per-thread CPU times.
#pragma once

#include <omp.h>

namespace quiver {

inline void keep_onednn_on_this_thread() {
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
}

}  // namespace quiver
