#include "runtime/cpu_stream.h"

#include <chrono>

namespace quiver {

CpuStream::CpuStream() {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        work();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      if (error && !error_) error_ = error;
      changed_.notify_all();
    }
  });
}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void CpuStream::submit(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(work));
  }
  changed_.notify_all();
}

void CpuStream::wait() { wait_at_most(0); }

void CpuStream::wait_at_most(size_t pending) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return queue_.size() + (busy_ ? 1 : 0) <= pending; });
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

namespace {
constexpr auto kSpin = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

void Rendezvous::arrive_and_wait() {
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == parties_) {
    arrived_.notify_all();
    return;
  }
  const auto give_up = std::chrono::steady_clock::now() + kSpin;
  int seen = 0;
  for (int spin = 1; (seen = arrived_.load(std::memory_order_acquire)) < parties_; ++spin) {
    if (spin % 64 == 0 && std::chrono::steady_clock::now() > give_up) break;
    cpu_relax();
  }
  while ((seen = arrived_.load(std::memory_order_acquire)) < parties_) arrived_.wait(seen, std::memory_order_acquire);
}

}  // namespace quiver
