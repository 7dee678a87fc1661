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

// Cores this process may use (the affinity mask, not just the machine's core count).
int available_cores();

}  // namespace quiver
