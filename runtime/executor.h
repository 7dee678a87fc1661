// Executor: runs a Plan's steps concurrently on "lanes". A lane is a persistent thread with its
// own thread budget (a TBB arena of its grant); ready steps start while lanes are free, in order
// of bottom level (the predicted time from the step to the end of the graph along its longest
// path), and a step's completion releases its successors (data, control and buffer-reuse edges).
// The first kernel error stops new launches, lets running steps finish, and is rethrown naming
// the node: nothing hangs.
//
// Policies: `serial` (one lane, one thread: the reference), `intra` (one lane with all threads:
// TensorFlow's recommended setting on one socket), `fixed` (`inter` lanes of `intra` threads).
// What it is not yet: the per-op performance model and the `auto` policy that grants each op its
// own thread count (issue 3); until then bottom levels use profiled step times when the Plan was
// profiled, and one unit per step otherwise.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/plan.h"

namespace quiver {

enum class Policy { Serial, Intra, Fixed };

Policy parse_policy(const std::string& name);  // "serial" | "intra" | "fixed"; throws otherwise
const char* name_of(Policy policy);

struct ExecutorOptions {
  Policy policy = Policy::Serial;
  int threads = 1;  // intra: threads of the one lane
  int inter = 1;    // fixed: lanes running side by side
  int intra = 1;    // fixed: threads per lane
  bool record_threads = false;  // note which threads ran each step's kernel work (tests)
};

class Executor {
 public:
  Executor(Plan& plan, ExecutorOptions options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void run();  // one step of the plan
  int lanes() const;
  int threads_per_lane() const;
  const std::vector<double>& bottom_levels() const { return bottom_levels_; }
  // With record_threads: distinct threads that ran each step's parallel work in the last run.
  const std::vector<int>& threads_used() const { return threads_used_; }

 private:
  struct State;
  Plan& plan_;
  ExecutorOptions options_;
  std::vector<std::vector<int>> successors_;
  std::vector<int> predecessor_count_;
  std::vector<double> bottom_levels_;
  std::vector<int> threads_used_;
  std::unique_ptr<State> state_;
};

}  // namespace quiver
