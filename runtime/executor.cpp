#include "runtime/executor.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <queue>
#include <thread>

#include "core/error.h"
#include "runtime/thread_budget.h"

namespace quiver {

Policy parse_policy(const std::string& name) {
  if (name == "serial") return Policy::Serial;
  if (name == "intra") return Policy::Intra;
  if (name == "fixed") return Policy::Fixed;
  throw Error(cat("unknown execution policy '", name, "' (choose serial, intra or fixed)"));
}

const char* name_of(Policy policy) {
  switch (policy) {
    case Policy::Serial: return "serial";
    case Policy::Intra: return "intra";
    case Policy::Fixed: return "fixed";
  }
  return "?";
}

namespace {

struct Completion {
  int lane = 0;
  int position = 0;
  std::exception_ptr error;
};

}  // namespace

struct Executor::State {
  struct Lane {
    std::unique_ptr<ThreadBudget> budget;
    std::thread thread;
    int assigned = -1;  // step position to run, -1 when idle
  };
  std::mutex mutex;
  std::condition_variable work;  // lanes wait for an assignment or stop
  std::condition_variable done;  // the dispatcher waits for completions
  std::vector<Lane> lanes;
  std::deque<Completion> completions;
  int64_t run_index = 0;
  bool stopping = false;
};

Executor::Executor(Plan& plan, ExecutorOptions options) : plan_(plan), options_(options), state_(std::make_unique<State>()) {
  int lane_count = 1, lane_threads = 1;
  switch (options_.policy) {
    case Policy::Serial: break;
    case Policy::Intra: lane_threads = options_.threads; break;
    case Policy::Fixed: lane_count = options_.inter, lane_threads = options_.intra; break;
  }
  if (lane_count < 1 || lane_threads < 1)
    throw Error(cat("executor: policy ", name_of(options_.policy), " needs at least one lane of one thread, got ",
                    lane_count, " x ", lane_threads));

  // Dependencies between step positions: data (producer of an input), control, buffer reuse.
  const Graph& graph = plan_.graph();
  const std::vector<PlanStep>& steps = plan_.steps();
  const int count = static_cast<int>(steps.size());
  std::map<NodeId, int> position_of;
  for (int p = 0; p < count; ++p) position_of[steps[p].node] = p;
  successors_.assign(count, {});
  predecessor_count_.assign(count, 0);
  for (int p = 0; p < count; ++p) {
    std::vector<int> before = steps[p].after;
    const Node& node = graph.node(steps[p].node);
    for (ValueId input : node.inputs) {
      auto found = position_of.find(graph.value(input).producer);
      if (found != position_of.end()) before.push_back(found->second);
    }
    for (NodeId control : node.control_inputs) {
      auto found = position_of.find(control);
      if (found != position_of.end()) before.push_back(found->second);
    }
    std::sort(before.begin(), before.end());
    before.erase(std::unique(before.begin(), before.end()), before.end());
    for (int q : before) successors_[q].push_back(p);
    predecessor_count_[p] = static_cast<int>(before.size());
  }
  // Bottom level: own cost plus the costliest path to the end. Positions are topological.
  bottom_levels_.assign(count, 0.0);
  for (int p = count - 1; p >= 0; --p) {
    double tail = 0.0;
    for (int s : successors_[p]) tail = std::max(tail, bottom_levels_[s]);
    bottom_levels_[p] = std::max(steps[p].seconds, 1e-6) + tail;
  }
  threads_used_.assign(count, 0);

  state_->lanes.resize(lane_count);
  for (int l = 0; l < lane_count; ++l) {
    state_->lanes[l].budget = std::make_unique<ThreadBudget>(lane_threads);
    state_->lanes[l].thread = std::thread([this, l] {
      State& state = *state_;
      std::unique_lock<std::mutex> lock(state.mutex);
      for (;;) {
        state.work.wait(lock, [&] { return state.stopping || state.lanes[l].assigned >= 0; });
        if (state.stopping) return;
        const int position = state.lanes[l].assigned;
        const int64_t run_index = state.run_index;
        ThreadBudget& budget = *state.lanes[l].budget;
        lock.unlock();
        Completion completion{l, position, nullptr};
        try {
          if (options_.record_threads) budget.record_threads(true);
          plan_.run_step(position, budget, run_index);
          if (options_.record_threads) {
            threads_used_[position] = static_cast<int>(budget.recorded_threads().size());
            budget.record_threads(false);
          }
        } catch (...) {
          completion.error = std::current_exception();
        }
        lock.lock();
        state.lanes[l].assigned = -1;
        state.completions.push_back(completion);
        state.done.notify_one();
      }
    });
  }
}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->work.notify_all();
  for (State::Lane& lane : state_->lanes)
    if (lane.thread.joinable()) lane.thread.join();
}

int Executor::lanes() const { return static_cast<int>(state_->lanes.size()); }
int Executor::threads_per_lane() const { return state_->lanes.at(0).budget->threads(); }

void Executor::run() {
  State& state = *state_;
  const int count = static_cast<int>(predecessor_count_.size());
  std::vector<int> waiting = predecessor_count_;
  auto later = [this](int a, int b) {  // priority: larger bottom level first, then plan order
    if (bottom_levels_[a] != bottom_levels_[b]) return bottom_levels_[a] < bottom_levels_[b];
    return a > b;
  };
  std::priority_queue<int, std::vector<int>, decltype(later)> ready(later);
  for (int p = 0; p < count; ++p)
    if (waiting[p] == 0) ready.push(p);

  std::unique_lock<std::mutex> lock(state.mutex);
  state.run_index = plan_.begin_run();
  int finished = 0, running = 0;
  std::exception_ptr first_error;
  while (finished < count) {
    bool launched = false;
    for (State::Lane& lane : state.lanes) {
      if (first_error || ready.empty()) break;
      if (lane.assigned >= 0) continue;
      lane.assigned = ready.top();
      ready.pop();
      ++running;
      launched = true;
    }
    if (launched) state.work.notify_all();
    if (running == 0) {
      if (first_error) break;
      throw Error(cat("executor: ", count - finished, " steps can never run (a dependency cycle)"));
    }
    state.done.wait(lock, [&] { return !state.completions.empty(); });
    while (!state.completions.empty()) {
      Completion completion = state.completions.front();
      state.completions.pop_front();
      --running;
      ++finished;
      if (completion.error) {
        if (!first_error) first_error = completion.error;
        continue;
      }
      for (int s : successors_[completion.position])
        if (--waiting[s] == 0) ready.push(s);
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace quiver
