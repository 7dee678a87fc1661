#include "runtime/thread_budget.h"

#include <sched.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "core/denormals.h"
#include "core/error.h"

#ifdef QUIVER_OWN_THREAD_POOL
#include <atomic>
#include <condition_variable>
#include <exception>
#include <system_error>
#else
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>
#endif

namespace quiver {

#ifdef QUIVER_OWN_THREAD_POOL
// ThreadSanitizer builds (QUIVER_SANITIZE=thread): Debian's libtbb is not instrumented, so TSAN
// cannot see how a TBB arena hands work to its threads and reports every kernel's writes as
// races. Here a budget of k threads is a fork-join pool of our own instead: k-1 workers plus the
// caller take chunks of at most `grain` items (TBB's simple partitioner does the same), and all
// of its synchronisation is visible to TSAN. One job at a time; a parallel_for from inside a
// job runs inline.
struct ThreadBudget::Arena {
  explicit Arena(int threads) {
    try {
      for (int i = 1; i < threads; ++i) workers.emplace_back([this] { work(); });
    } catch (const std::system_error& error) {  // no destructor runs for a half-made arena
      stop();
      throw Error(cat("thread budget: cannot start thread ", workers.size() + 1, " of ", threads - 1, ": ", error.what()));
    }
  }
  ~Arena() { stop(); }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    for (std::thread& worker : workers) worker.join();
  }

  void run(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& chunk) {
    if (inside_job) {
      chunk(0, count);
      return;
    }
    std::lock_guard<std::mutex> one_job(job_mutex);
    {
      std::lock_guard<std::mutex> lock(mutex);
      job = &chunk;
      job_count = count;
      job_grain = grain;
      next.store(0);
      busy = static_cast<int>(workers.size());
      ++generation;
    }
    wake.notify_all();
    take_chunks();
    std::unique_lock<std::mutex> lock(mutex);
    done.wait(lock, [this] { return busy == 0; });
    job = nullptr;
    if (error) {  // the first chunk's exception, once every worker has let go of the job (as TBB does)
      std::exception_ptr first = error;
      error = nullptr;
      std::rethrow_exception(first);
    }
  }

 private:
  void take_chunks() {
    inside_job = true;
    try {
      for (int64_t begin = next.fetch_add(job_grain); begin < job_count; begin = next.fetch_add(job_grain))
        (*job)(begin, std::min(job_count, begin + job_grain));
    } catch (...) {
      next.store(job_count);  // no more chunks for anyone
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
    }
    inside_job = false;
  }
  void work() {
    int64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return stopping || generation != seen; });
        if (stopping) return;
        seen = generation;
      }
      take_chunks();
      {
        std::lock_guard<std::mutex> lock(mutex);
        --busy;
      }
      done.notify_one();
    }
  }

  static thread_local bool inside_job;
  std::vector<std::thread> workers;
  std::mutex job_mutex;  // one parallel_for at a time
  std::mutex mutex;
  std::condition_variable wake, done;
  const std::function<void(int64_t, int64_t)>* job = nullptr;
  int64_t job_count = 0, job_grain = 1, generation = 0;
  std::atomic<int64_t> next{0};
  int busy = 0;
  bool stopping = false;
  std::exception_ptr error;  // the first exception a chunk threw in the current job
};
thread_local bool ThreadBudget::Arena::inside_job = false;
#else
namespace {

// TBB starts no more threads than its default concurrency (the cores this process may use),
// whatever an arena asks for. Allowances of more threads than that (a --threads above the cores,
// learners that together ask for more; warned about) raise the limit to the largest of them while
// they live, so that their threads exist and take turns on the cores, as those of the pool above
// do: otherwise ops granted them would run on fewer threads than the plan counts. One control at
// a time: TBB applies the smallest of those alive.
class RaisedLimits {
 public:
  static RaisedLimits& get() {
    static RaisedLimits limits;
    return limits;
  }
  // True when `threads` is above TBB's default concurrency and now counts; remove() it then.
  bool add(int threads) {
    if (threads <= tbb::info::default_concurrency()) return false;
    std::lock_guard lock(mutex_);
    sizes_.insert(threads);
    apply();
    return true;
  }
  void remove(int threads) {
    std::lock_guard lock(mutex_);
    if (auto found = sizes_.find(threads); found != sizes_.end()) sizes_.erase(found);
    apply();
  }

 private:
  void apply() {
    const size_t wanted = sizes_.empty() ? 0 : static_cast<size_t>(*sizes_.rbegin());
    if (wanted == active_) return;
    control_.reset();  // before the next: the smaller of two alive would apply
    if (wanted > 0)
      control_ = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, wanted);
    active_ = wanted;
  }
  std::mutex mutex_;
  std::multiset<int> sizes_;
  std::unique_ptr<tbb::global_control> control_;
  size_t active_ = 0;
};

}  // namespace

struct ThreadBudget::Arena {
  explicit Arena(int threads) : allowance(threads), arena(threads, 1) {}
  ThreadAllowance allowance;  // before the arena: TBB's limit is raised when the arena first asks
  mutable tbb::task_arena arena;
};
#endif

#ifdef QUIVER_OWN_THREAD_POOL
ThreadAllowance::ThreadAllowance(int threads) : threads_(threads), raised_(false) {}
ThreadAllowance::~ThreadAllowance() = default;
int thread_limit() { return std::numeric_limits<int>::max(); }
#else
int thread_limit() {
  return static_cast<int>(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
}

ThreadAllowance::ThreadAllowance(int threads) : threads_(threads), raised_(RaisedLimits::get().add(threads)) {}
ThreadAllowance::~ThreadAllowance() {
  if (raised_) RaisedLimits::get().remove(threads_);
}
#endif

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
    const FlushDenormals flushed;
    body(0, count);
    return;
  }
#ifdef QUIVER_OWN_THREAD_POOL
  arena_->run(count, grain, [&](int64_t begin, int64_t end) {
    if (recording_) note_thread();
    const FlushDenormals flushed;  // a worker flushes like the thread that granted it the work
    body(begin, end);
  });
#else
  arena_->arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, grain),
                      [&](const tbb::blocked_range<int64_t>& range) {
                        if (recording_) note_thread();
                        const FlushDenormals flushed;  // a worker flushes like the caller
                        body(range.begin(), range.end());
                      },
                      tbb::simple_partitioner());
  });
#endif
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
