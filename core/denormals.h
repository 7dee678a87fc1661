// Flush-to-zero for the arithmetic of one scope: kernels run with subnormal floats read and
// written as zero (x86's MXCSR FTZ and DAZ bits), and the thread's previous mode comes back when
// the scope ends, so a caller's own threads are left as they were.
//
// Why: a subnormal float costs a microcode assist on most x86 cores, about a hundred cycles per
// operation on Intel's. Training makes them: the momentum of a weight whose gradient stays near
// zero decays by mu every step into the subnormal range. On a 2-vCPU Intel Xeon host the SGD
// update kernel took 46% of the MLP's training time in quiver-bench-policies until kernels ran
// flushed (docs/benchmarks.md, "Subnormal floats"). TensorFlow flushes in every op for the same
// reason; results change only below 1.2e-38, far inside every tolerance.
//
// What it is not: a switch of the whole process. Other architectures keep IEEE subnormals.
#pragma once

#if defined(__SSE2__) || defined(__x86_64__)
#include <xmmintrin.h>
#define QUIVER_HAS_MXCSR 1
#endif

namespace quiver {

class FlushDenormals {
 public:
#ifdef QUIVER_HAS_MXCSR
  static constexpr unsigned kFlushBits = 0x8040u;  // FTZ (bit 15) | DAZ (bit 6)
  FlushDenormals() : saved_(_mm_getcsr()) {
    if ((saved_ & kFlushBits) != kFlushBits) _mm_setcsr(saved_ | kFlushBits);
  }
  ~FlushDenormals() {
    if ((saved_ & kFlushBits) != kFlushBits) _mm_setcsr(saved_);
  }
  // Whether this thread's arithmetic flushes now.
  static bool active() { return (_mm_getcsr() & kFlushBits) == kFlushBits; }

 private:
  unsigned saved_;
#else
  static bool active() { return false; }
#endif
 public:
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;
};

}  // namespace quiver
