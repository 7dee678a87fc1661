// ThreadBudget: an execution context backed by a TBB task arena of a fixed size. A kernel given a
// ThreadBudget of k threads runs its parallel_for bodies on at most k threads (the caller plus
// k-1 arena workers). TBB stays out of this header.
#pragma once

#include <memory>

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

 private:
  struct Arena;
  int threads_;
  std::unique_ptr<Arena> arena_;
};

// Cores this process may use (the affinity mask, not just the machine's core count).
int available_cores();

}  // namespace quiver
