// ThreadBudget: an execution context backed by a TBB task arena of a fixed size (in
// ThreadSanitizer builds, a pool of Quiver's own with the same contract). A kernel given a
// ThreadBudget of k threads runs its parallel_for bodies on at most k threads (the caller plus
// k-1 arena workers); k may exceed the cores, and then the k threads exist and take turns on
// them. TBB stays out of this header.
#pragma once

#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/op.h"

namespace quiver {

class ThreadBudget final : public ExecContext {
 public:
  explicit ThreadBudget(int threads);
  ~ThreadBudget() override;
  ThreadBudget(const ThreadBudget&) = delete;
  ThreadBudget& operator=(const ThreadBudget&) = delete;

  int threads() const override { return threads_; }
  void parallel_for(int64_t count, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& body) const override;

  // Verification, not assumption: while recording, every thread that runs a parallel_for body
  // is noted, so tests can check an op granted k threads used at most k.
  void record_threads(bool on);
  std::vector<std::thread::id> recorded_threads() const;

 private:
  void note_thread() const;
  struct Arena;
  int threads_;
  std::unique_ptr<Arena> arena_;
  bool recording_ = false;
  mutable std::mutex recorded_mutex_;
  mutable std::vector<std::thread::id> recorded_;
};

// While alive, TBB may run `threads` threads at once (its workers plus one caller) where that is
// more than the cores; at or below them it changes nothing. A ThreadBudget above the cores holds
// one for itself. Budgets within the cores that together ask for more threads than the cores hold
// one for their sum: a group of learners of T threads each has each learner's thread run its ops
// with T - 1 workers, which would otherwise share TBB's cores - 1. In ThreadSanitizer builds,
// whose budgets start their own threads, it does nothing.
class ThreadAllowance {
 public:
  explicit ThreadAllowance(int threads);
  ~ThreadAllowance();
  ThreadAllowance(const ThreadAllowance&) = delete;
  ThreadAllowance& operator=(const ThreadAllowance&) = delete;

 private:
  int threads_;
  bool raised_;
};

// The most threads TBB may run at once now (the cores, or a live allowance above them); in
// ThreadSanitizer builds, whose budgets start their own threads, no limit (INT_MAX).
int thread_limit();

// Cores this process may use (the affinity mask, not just the machine's core count).
int available_cores();

}  // namespace quiver
