#include "runtime/cpu_stream.h"

#include <chrono>

namespace quiver {

namespace {
constexpr auto kSpin = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until done() or for kSpin (not at all unless `spin`); returns done().
template <typename Done>
bool spin_until(Done done, bool spin = true) {
  if (!spin) return done();
  const auto give_up = std::chrono::steady_clock::now() + kSpin;
  for (int tries = 1; !done(); ++tries) {
    if (tries % 64 == 0 && std::chrono::steady_clock::now() > give_up) return done();
    cpu_relax();
  }
  return true;
}
}  // namespace

CpuStream::CpuStream() {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (queue_.empty() && !stopping_) {
        const size_t seen = submitted_.load(std::memory_order_relaxed);
        lock.unlock();
        spin_until([&] { return submitted_.load(std::memory_order_acquire) != seen; },
                   spinning_.load(std::memory_order_relaxed));
        lock.lock();
      }
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
      outstanding_.fetch_sub(1, std::memory_order_release);
      if (error && !error_) error_ = error;
      changed_.notify_all();
    }
  });
}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    submitted_.fetch_add(1, std::memory_order_release);  // ends an idle spin at once
  }
  changed_.notify_all();
  thread_.join();
}

void CpuStream::submit(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(work));
    outstanding_.fetch_add(1, std::memory_order_relaxed);
    submitted_.fetch_add(1, std::memory_order_release);
  }
  changed_.notify_all();
}

void CpuStream::wait() { wait_at_most(0); }

void CpuStream::wait_at_most(size_t pending) {
  spin_until([&] { return outstanding_.load(std::memory_order_acquire) <= pending; },
             spinning_.load(std::memory_order_relaxed));
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return queue_.size() + (busy_ ? 1 : 0) <= pending; });
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

void Rendezvous::arrive() {
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == parties_) arrived_.notify_all();
}

void Rendezvous::arrive_and_wait() {
  arrive();
  spin_until([&] { return arrived_.load(std::memory_order_acquire) == parties_; }, spin_);
  for (int seen = 0; (seen = arrived_.load(std::memory_order_acquire)) < parties_;)
    arrived_.wait(seen, std::memory_order_acquire);
}

}  // namespace quiver
