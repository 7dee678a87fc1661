// CpuStream: a learner's stream on the CPU. Work submitted to it runs in order on the stream's own
// thread, so learners on different streams progress at once; the thread budget each learner's
// ops may use is its executor's (a task arena of the granted threads). wait() blocks until the
// stream is idle and rethrows the first error of its work. (A CUDA learner's stream is ordered
// through DeviceBackend::order and synchronize instead.) wait_at_most(n) is the clock gate of
// bounded staleness: it returns once at most n submitted pieces of work are unfinished. The
// stream's thread, when idle, and a caller of wait_at_most spin for up to 200 us before they
// sleep: a learner's next step comes within tens of microseconds at small batches, and waking a
// sleeping thread costs about that much again on a VM.
// Rendezvous: where a round's CPU learners meet before they share the SMA pass.
#pragma once

#include <atomic>
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
  // Whether the stream's thread and its waiters spin before they sleep (default yes). Spinning
  // pays only while every spinning thread has a core of its own: a group of learners with more
  // threads than cores turns it off.
  void set_spinning(bool on) { spinning_.store(on, std::memory_order_relaxed); }
  void wait();
  // Blocks until at most `pending` pieces of work are queued or running; rethrows the first error.
  void wait_at_most(size_t pending);

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stopping_ = false;
  std::exception_ptr error_;
  // Mirrors for spinning without the lock: pieces of work submitted so far, and those queued or
  // running now (both changed under mutex_).
  std::atomic<size_t> submitted_{0}, outstanding_{0};
  std::atomic<bool> spinning_{true};
  std::thread thread_;
};

// The learners of one round meet here after their steps, then each takes a share of the SMA pass
// on its own threads. A waiter spins (if asked to) for up to 200 us before it sleeps: the learners' steps end
// within tens of microseconds of each other, and a sleeping thread takes about that long again
// to be woken on a VM. One object per round; every party must arrive exactly once (also after
// an error, so that no one waits for ever).
class Rendezvous {
 public:
  // `spin`: as CpuStream::set_spinning.
  Rendezvous(int parties, bool spin) : parties_(parties), spin_(spin) {}
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;
  void arrive_and_wait();
  // Arrives without waiting: for a party that cannot come itself (its work was never started).
  void arrive();

 private:
  const int parties_;
  const bool spin_;
  std::atomic<int> arrived_{0};
};

}  // namespace quiver
