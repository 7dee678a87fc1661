#include "runtime/thread_budget.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include "core/error.h"

namespace quiver {

struct ThreadBudget::Arena {
  explicit Arena(int threads) : arena(threads, 1) {}
  mutable tbb::task_arena arena;
};

ThreadBudget::ThreadBudget(int threads) : threads_(threads) {
  if (threads < 1) throw Error(cat("a thread budget needs at least 1 thread, got ", threads));
  if (threads > 1) arena_ = std::make_unique<Arena>(threads);
}

ThreadBudget::~ThreadBudget() = default;

void ThreadBudget::parallel_for(int64_t count, int64_t grain,
                                const std::function<void(int64_t, int64_t)>& body) const {
  if (count <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (threads_ == 1 || count <= grain) {
    if (recording_) note_thread();
    body(0, count);
    return;
  }
  arena_->arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, grain),
                      [&](const tbb::blocked_range<int64_t>& range) {
                        if (recording_) note_thread();
                        body(range.begin(), range.end());
                      },
                      tbb::simple_partitioner());
  });
}

void ThreadBudget::record_threads(bool on) {
  std::lock_guard<std::mutex> lock(recorded_mutex_);
  recording_ = on;
  recorded_.clear();
}

std::vector<std::thread::id> ThreadBudget::recorded_threads() const {
  std::lock_guard<std::mutex> lock(recorded_mutex_);
  return recorded_;
}

void ThreadBudget::note_thread() const {
  std::lock_guard<std::mutex> lock(recorded_mutex_);
  std::thread::id self = std::this_thread::get_id();
  if (std::find(recorded_.begin(), recorded_.end(), self) == recorded_.end()) recorded_.push_back(self);
}

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace quiver
