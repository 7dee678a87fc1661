// CpuStream: a learner's stream on the CPU. Work submitted to it runs in order on the stream's own
// thread, so learners on different streams progress at once; the thread budget each learner's
// ops may use is its executor's (a task arena of the granted threads). wait() blocks until the
// stream is idle and rethrows the first error of its work. The CUDA backend's stream (a
// non-blocking cudaStream_t) offers the same three calls. wait_at_most(n) is the clock gate of
// bounded staleness: it returns once at most n submitted pieces of work are unfinished.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace quiver {

class CpuStream {
 public:
  CpuStream();
  ~CpuStream();  // finishes submitted work, then joins
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  void submit(std::function<void()> work);
  void wait();
  // Blocks until at most `pending` pieces of work are queued or running; rethrows the first error.
  void wait_at_most(size_t pending);

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace quiver
