// The concurrent executor against the serial reference: the bundled models under every policy,
// random DAGs, honoured thread grants (own kernels and the oneDNN path), co-running ops within the
// thread budget, a throwing kernel, and many consecutive steps.
#include <gtest/gtest.h>

#include <limits>

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <random>

#include "core/autodiff.h"
#include "core/error.h"
#include "models/models.h"
#include "ops/kernel_util.h"
#include "runtime/executor.h"
#include "tests/runtime/address_space.h"
#include "runtime/thread_budget.h"
#include "runtime/trace.h"
#include "runtime/trainer.h"

namespace quiver {
namespace {

ExecutorOptions executor_options(Policy policy, int threads, int inter = 1, int intra = 1) {
  ExecutorOptions options;
  options.policy = policy;
  options.threads = threads;
  options.inter = inter;
  options.intra = intra;
  options.profile_samples = 1;
  return options;
}

struct PolicyCase {
  std::string policy;
  int threads, inter, intra;
};

void PrintTo(const PolicyCase& c, std::ostream* out) { *out << c.policy << c.inter << "x" << c.intra; }

class EveryPolicy : public ::testing::TestWithParam<PolicyCase> {};

// Same data, 20 steps: the loss and every parameter match the serial reference (Plan::run with one
// thread). Tolerance 1e-4 relative + 1e-5: kernels given more threads split GEMMs and conv
// weight-gradient sums differently, which changes float rounding but nothing else. Every model
// draws its own data from the same seed, so one model's data do not depend on the others'.
// (Rounding can still flip a decision: a max-pool window whose two largest values are within
// rounding of each other, or a ReLU input within rounding of 0, sends the gradient elsewhere, and
// the parameters part by
// more than any rounding tolerance. Such a tie is rare; when the bias-gradient sums changed their
// order on 2026-11-25, the CNN's data, then drawn after the MLP's, met one: 1.9x the tolerance,
// while seeds 3-8 of the CNN's own data stayed within 0.003-0.004 of it, as before the change.)
TEST_P(EveryPolicy, MatchesSerialAfter20Steps) {
  const PolicyCase& c = GetParam();
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  for (const std::string& name : models::names()) {
    std::mt19937 rng(3);
    std::vector<float> images(16 * 784 * 4);
    for (float& v : images) v = pixel(rng);
    std::vector<int32_t> labels(16 * 4);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(rng() % 10);
    std::vector<double> losses[2];
    std::vector<float> params[2];
    for (int variant = 0; variant < 2; ++variant) {
      TrainOptions options;
      options.batch = 16;
      options.eval_batch = 16;
      options.threads = variant == 0 ? 1 : c.threads;
      options.profile_samples = 1;  // auto: 3 profiling steps, then 17 scheduled ones
      options.policy = "";          // the reference: Plan::run, one thread
      if (variant == 1) options.policy = c.policy, options.inter = c.inter, options.intra = c.intra;
      Trainer trainer(models::by_name(name), options);
      for (int step = 0; step < 20; ++step)
        losses[variant].push_back(trainer.train_step(images.data() + (step % 4) * 16 * 784, labels.data() + (step % 4) * 16));
      const Tensor& flat = trainer.params().flat_params();
      params[variant].assign(flat.f32(), flat.f32() + flat.numel());
    }
    for (int step = 0; step < 20; ++step)
      ASSERT_NEAR(losses[1][step], losses[0][step], 1e-4 * std::abs(losses[0][step]) + 1e-5) << name << " step " << step;
    for (size_t i = 0; i < params[0].size(); ++i)
      ASSERT_NEAR(params[1][i], params[0][i], 1e-4 * std::abs(params[0][i]) + 1e-5) << name << " parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, EveryPolicy,
                         ::testing::Values(PolicyCase{"serial", 1, 1, 1}, PolicyCase{"intra", 2, 1, 1},
                                           PolicyCase{"fixed", 1, 2, 1}, PolicyCase{"fixed", 1, 1, 2},
                                           PolicyCase{"auto", 2, 1, 1}, PolicyCase{"auto", 1, 1, 1}),
                         [](const auto& info) {
                           return info.param.policy + std::to_string(info.param.threads) + "t" +
                                  std::to_string(info.param.inter) + "x" + std::to_string(info.param.intra);
                         });

// Random DAGs of elementwise ops and matmuls with fan-out and reuse of earlier values, and in
// every other trial their backward (gradients accumulated over the fan-out): with one thread per
// op (fixed 2x1) the concurrent executor's results equal the serial reference bit for bit; intra,
// fixed 1x2 and auto, which may split a matmul over two threads, agree to float rounding. Auto runs
// 8 steps: 3 profiling ones, then scheduled ones.
TEST(Executor, RandomDagsMatchSerial) {
  const std::vector<ExecutorOptions> concurrent = {executor_options(Policy::Fixed, 1, 2, 1),
                                                   executor_options(Policy::Intra, 2),
                                                   executor_options(Policy::Fixed, 1, 1, 2),
                                                   executor_options(Policy::Auto, 2)};
  for (int trial = 0; trial < 20; ++trial) {
    std::mt19937 rng(100 + trial);
    const bool backward = trial % 2 == 1;
    GraphBuilder b;
    const int64_t n = 4 + rng() % 12;
    // With a backward, x is a parameter: its gradient sums every path from x to the loss.
    std::vector<Value> values{backward ? b.parameter("x", Shape{n, n}, ParamInit::zeros()) : b.input("x", Shape{n, n}),
                              b.input("y", Shape{n, n})};
    const int nodes = 10 + static_cast<int>(rng() % 30);
    for (int i = 0; i < nodes; ++i) {
      Value a = values[rng() % values.size()], c = values[rng() % values.size()];
      switch (rng() % 5) {
        case 0: values.push_back(b.add(a, c)); break;
        case 1: values.push_back(b.mul(a, c)); break;
        case 2: values.push_back(b.tanh(a)); break;
        case 3: values.push_back(b.matmul(a, c, rng() % 2, rng() % 2)); break;
        default: values.push_back(b.sigmoid(a)); break;
      }
    }
    std::vector<Value> fetches(values.end() - 3, values.end());
    if (backward) {
      Value sum = b.add(b.add(fetches[0], fetches[1]), fetches[2]);
      Value loss = b.reshape(b.matmul(b.reshape(sum, Shape{1, n * n}), b.input("r", Shape{n * n, 1})), Shape{});
      build_backward(b, loss);
      fetches.push_back(Value{b.graph().params()[0].grad});
    }
    ParamStore store(b.graph());
    std::vector<std::vector<std::vector<float>>> results(concurrent.size() + 1);
    for (size_t variant = 0; variant <= concurrent.size(); ++variant) {
      Plan plan(b.graph(), store, fetches);
      std::mt19937 fill(7);
      std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
      const Tensor& x = backward ? store.param(0) : plan.input("x");
      for (int64_t k = 0; k < n * n; ++k) x.f32()[k] = unit(fill);
      for (int64_t k = 0; k < n * n; ++k) plan.input("y").f32()[k] = unit(fill);
      if (backward)
        for (int64_t k = 0; k < n * n; ++k) plan.input("r").f32()[k] = unit(fill);
      if (variant == 0) {
        plan.run();
      } else {
        const ExecutorOptions& options = concurrent[variant - 1];
        Executor executor(plan, options);
        for (int step = 0; step < (options.policy == Policy::Auto ? 8 : 1); ++step) executor.run();
        if (options.policy == Policy::Auto) {
          ASSERT_TRUE(executor.profiled());
        }
      }
      for (Value fetch : fetches) {
        const Tensor& t = plan.tensor(fetch);
        results[variant].emplace_back(t.f32(), t.f32() + t.numel());
      }
    }
    for (size_t f = 0; f < fetches.size(); ++f) {
      ASSERT_EQ(results[1][f], results[0][f]) << "trial " << trial << ", fixed 2x1, fetch " << f;
      for (size_t variant = 2; variant < results.size(); ++variant)
        for (size_t i = 0; i < results[0][f].size(); ++i)
          ASSERT_NEAR(results[variant][f][i], results[0][f][i], 1e-5 * std::abs(results[0][f][i]) + 1e-6)
              << "trial " << trial << ", " << name_of(concurrent[variant - 1].policy) << ", fetch " << f;
    }
  }
}

// A policy other than auto has one schedule, named after the policy (it read "model", auto's
// name for the performance model's grants, under serial too).
TEST(Executor, AFixedPolicysScheduleIsNamedAfterIt) {
  TrainOptions train;
  train.batch = 4;
  train.eval_batch = 4;
  train.policy = "";
  Trainer trainer(models::mlp(), train);
  for (const auto& [policy, name] : {std::pair{Policy::Serial, "serial"}, std::pair{Policy::Intra, "intra"},
                                     std::pair{Policy::Fixed, "fixed"}}) {
    Executor executor(trainer.train_plan(), executor_options(policy, 2, 2, 1));
    EXPECT_EQ(executor.chosen_schedule(), name);
  }
}

// Every op ran its parallel work on at most the threads it was given, and the given threads never
// exceeded the policy's budget; the whole budget was granted somewhere (an executor that always
// granted one thread would honour every grant).
TEST(Executor, GrantedThreadsAreHonoured) {
  for (ExecutorOptions options : {executor_options(Policy::Intra, 2), executor_options(Policy::Fixed, 1, 2, 1),
                                  executor_options(Policy::Fixed, 1, 1, 2), executor_options(Policy::Auto, 2)}) {
    options.record_threads = true;
    TrainOptions train;
    train.batch = 64;
    train.eval_batch = 64;
    train.policy = "";
    Trainer trainer(models::cnn(), train);
    Executor executor(trainer.train_plan(), options);
    // auto: the warm-up at 2 threads, profiling at 1 and 2, then trial schedules.
    const int budget = options.policy == Policy::Fixed ? options.intra : options.threads;
    int largest_grant = 0;
    for (int step = 0; step < 6; ++step) {
      executor.run();
      for (size_t p = 0; p < executor.threads_used().size(); ++p) {
        const std::string& name = trainer.train_graph().node(trainer.train_plan().steps()[p].node).name;
        ASSERT_GE(executor.last_threads()[p], 1) << name;
        ASSERT_LE(executor.last_threads()[p], budget) << name;
        EXPECT_LE(executor.threads_used()[p], executor.last_threads()[p]) << name << " step " << step;
        largest_grant = std::max(largest_grant, executor.last_threads()[p]);
      }
    }
    EXPECT_EQ(largest_grant, budget);
    // Whether a TBB worker joins an arena depends on the machine's load (ctest runs tests side
    // by side), so using both granted threads is shown by ThreadBudget.UsesTheThreadsItGrants.
  }
}

// Records, per node, how many threads the ExecContext its kernel was handed grants (the kernel's
// own output is its input, copied).
std::mutex context_threads_mutex;
std::map<std::string, int> context_threads;
const bool registered_recording_op = [] {
  OpDef def;
  def.kind = "test_records_threads";
  def.infer = [](const InferContext& ctx) { return std::vector<TensorType>{ctx.inputs[0]}; };
  def.kernels.push_back(cpu_kernel("reference", [](const KernelCall& call) {
    {
      std::lock_guard<std::mutex> lock(context_threads_mutex);
      context_threads[call.node.name] = call.ctx.threads();
    }
    call.outputs[0].copy_from(call.inputs[0]);
  }));
  return register_op(std::move(def));
}();

// What a kernel is handed is what it was granted: the context's thread count equals the grant,
// for ops one at a time with all threads, two side by side with one each, and auto's choice. (Its
// TBB workers may or may not join, by the machine's load: this holds whatever they do.)
TEST(Executor, EachKernelIsHandedAContextOfItsGrant) {
  GraphBuilder b;
  Value x = b.input("x", Shape{16, 16});
  std::vector<Value> branches;
  for (int i = 0; i < 4; ++i) {
    Value v = x;
    for (int j = 0; j < 3; ++j) v = b.apply1("test_records_threads", {v}, {}, cat("rec_", i, "_", j));
    branches.push_back(v);
  }
  Value out = b.add(b.add(branches[0], branches[1]), b.add(branches[2], branches[3]));
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {out});
  for (const ExecutorOptions& options : {executor_options(Policy::Intra, 2), executor_options(Policy::Fixed, 1, 2, 1),
                                         executor_options(Policy::Fixed, 1, 1, 2), executor_options(Policy::Auto, 2),
                                         executor_options(Policy::Serial, 2)}) {
    SCOPED_TRACE(cat(name_of(options.policy), " ", options.inter, "x", options.intra));
    Executor executor(plan, options);
    for (int step = 0; step < 8; ++step) {
      {
        std::lock_guard<std::mutex> lock(context_threads_mutex);
        context_threads.clear();
      }
      executor.run();
      std::lock_guard<std::mutex> lock(context_threads_mutex);
      int recorded = 0;
      for (size_t p = 0; p < plan.steps().size(); ++p) {
        const std::string& name = b.graph().node(plan.steps()[p].node).name;
        if (name.rfind("rec_", 0) != 0) continue;
        ++recorded;
        ASSERT_EQ(context_threads.count(name), 1u) << name;
        EXPECT_EQ(context_threads[name], executor.last_threads()[p]) << name << " step " << step;
      }
      EXPECT_EQ(recorded, 12);
    }
  }
}

// A budget of k threads can really run k bodies at once: each chunk waits (up to 10 s) until k
// distinct threads have arrived, which only happens if the arena gave it k threads. Also for more
// threads than cores (a --threads above them): TBB would start no more than the cores otherwise.
TEST(ThreadBudget, UsesTheThreadsItGrants) {
  if (available_cores() < 2) GTEST_SKIP() << "needs 2 cores";
  for (int k : {2, std::min(available_cores(), 4), available_cores() + 2}) {
    ThreadBudget budget(k);
    budget.record_threads(true);
    std::mutex mutex;
    std::condition_variable arrived;
    std::set<std::thread::id> seen;
    budget.parallel_for(k, 1, [&](int64_t, int64_t) {
      std::unique_lock<std::mutex> lock(mutex);
      seen.insert(std::this_thread::get_id());
      arrived.notify_all();
      arrived.wait_for(lock, std::chrono::seconds(10), [&] { return static_cast<int>(seen.size()) >= k; });
    });
    EXPECT_EQ(static_cast<int>(seen.size()), k);
    EXPECT_EQ(static_cast<int>(budget.recorded_threads().size()), k);
  }
}

// Budgets each within the cores that together ask for more (learners of several threads each):
// under an allowance for their sum, two budgets of `cores` threads run all 2 x cores bodies at
// once (each body waits, up to 10 s, for every one of them). Without it TBB has cores - 1
// workers for the two budgets' 2 x (cores - 1) seats, and the bodies wait out the 10 s. The
// limit falls back when the allowance goes.
TEST(ThreadBudget, BudgetsSideBySideUseAllTheirThreadsUnderAnAllowance) {
  const int k = std::max(2, available_cores());
  const int limit_before = thread_limit();
  {
    ThreadAllowance allowance(2 * (k - 1) + 1);
    EXPECT_GE(thread_limit(), 2 * (k - 1) + 1);
    std::mutex mutex;
    std::condition_variable arrived;
    std::set<std::thread::id> seen;
    std::vector<std::set<std::thread::id>> seen_by(2);
    auto run = [&](int b) {
      ThreadBudget budget(k);
      budget.parallel_for(k, 1, [&](int64_t, int64_t) {
        std::unique_lock<std::mutex> lock(mutex);
        seen.insert(std::this_thread::get_id());
        seen_by[b].insert(std::this_thread::get_id());
        arrived.notify_all();
        arrived.wait_for(lock, std::chrono::seconds(10), [&] { return static_cast<int>(seen.size()) >= 2 * k; });
      });
    };
    std::thread other(run, 1);
    run(0);
    other.join();
    EXPECT_EQ(static_cast<int>(seen.size()), 2 * k);
    EXPECT_EQ(static_cast<int>(seen_by[0].size()), k);
    EXPECT_EQ(static_cast<int>(seen_by[1].size()), k);
  }
  EXPECT_EQ(thread_limit(), limit_before);
}

// A body that throws (on whichever thread runs that chunk) reaches the caller once the others
// have let go, and the budget stays usable: in the TBB build and in the TSAN build's own pool.
TEST(ThreadBudget, AThrowingBodyReachesTheCallerAndTheBudgetLivesOn) {
  ThreadBudget budget(2);
  for (int round = 0; round < 20; ++round) {
    EXPECT_THROW(budget.parallel_for(64, 1,
                                     [&](int64_t begin, int64_t) {
                                       if (begin == (round * 7) % 64) throw Error("chunk failed");
                                     }),
                 Error);
    std::atomic<int64_t> sum{0};
    budget.parallel_for(1000, 10, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) sum += i;
    });
    EXPECT_EQ(sum.load(), 999 * 1000 / 2);
  }
}

// CPU time each thread of this process has run, in ns (/proc/self/task/*/schedstat).
std::map<int, uint64_t> thread_cpu_ns() {
  std::map<int, uint64_t> times;
  DIR* dir = opendir("/proc/self/task");
  if (!dir) return times;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream in(std::string("/proc/self/task/") + entry->d_name + "/schedstat");
    uint64_t ns = 0;
    if (in >> ns) times[std::atoi(entry->d_name)] = ns;
  }
  closedir(dir);
  return times;
}

// The oneDNN path (convolutions and GEMMs; oneDNN is built with OpenMP on Debian) honours its
// grant too: measured by the OS, not by Quiver's own bookkeeping. The oneDNN steps of a CNN step,
// then every step of it (Quiver's own kernels too), run many times in a budget of k threads, and
// the threads of the process that gained a real share of CPU time meanwhile are counted: at most
// k. Without the kernels' OpenMP width of one, oneDNN's own OpenMP team shows up here as an extra
// busy thread; a kernel that started threads of its own would too.
TEST(Executor, OneDnnKernelsStayWithinTheirGrant) {
  if (thread_cpu_ns().empty()) GTEST_SKIP() << "/proc/self/task/*/schedstat is not readable here";
  TrainOptions train;
  train.batch = 64;
  train.eval_batch = 64;
  train.policy = "";
  Trainer trainer(models::cnn(), train);
  Plan& plan = trainer.train_plan();
  plan.run();
  std::vector<int> onednn_steps;
  for (int p = 0; p < static_cast<int>(plan.steps().size()); ++p) {
    const std::string& kernel = plan.steps()[p].kernel_name;
    if (kernel.find("onednn") != std::string::npos) onednn_steps.push_back(p);
  }
  ASSERT_GE(onednn_steps.size(), 4u) << "the CNN step should run convolutions and GEMMs through oneDNN";
  std::vector<int> every_step(plan.steps().size());
  for (size_t p = 0; p < every_step.size(); ++p) every_step[p] = static_cast<int>(p);
  // The oneDNN steps alone, then the whole step (Quiver's own kernels too), in budgets of k.
  for (const std::vector<int>* steps : {&onednn_steps, &every_step}) {
    for (int k : {1, 2}) {
      SCOPED_TRACE(steps == &onednn_steps ? "oneDNN steps" : "every step");
      ThreadBudget budget(k);
      for (int p : *steps) plan.run_step(p, budget, 0);  // warm the arena's workers
      std::map<int, uint64_t> before = thread_cpu_ns();
      for (int repeat = 0; repeat < 10; ++repeat)
        for (int p : *steps) plan.run_step(p, budget, 0);
      std::map<int, uint64_t> after = thread_cpu_ns();
      uint64_t busiest = 0;
      std::map<int, uint64_t> gained;
      for (auto [tid, ns] : after) {
        gained[tid] = ns - (before.count(tid) ? before[tid] : 0);
        busiest = std::max(busiest, gained[tid]);
      }
      int busy = 0;
      for (auto [tid, ns] : gained) busy += ns > busiest / 5;
      std::string detail;
      for (auto [tid, ns] : gained) detail += cat(" ", tid, ":", ns / 1000, "us");
      EXPECT_LE(busy, k) << "threads with over a fifth of the busiest thread's CPU time, budget " << k << ":" << detail;
      EXPECT_GE(busy, 1);
    }
  }
}

// auto never runs ops whose granted threads add up to more than it may use: checked on the trace,
// whose events carry each execution's granted threads and times, and on the executor's own
// count. The CNN step has ops that co-run (the backward's weight and input gradients, updates).
TEST(Executor, CoRunningOpsStayWithinTheThreadBudget) {
  TrainOptions train;
  train.batch = 16;
  train.eval_batch = 16;
  train.policy = "";
  Trainer trainer(models::cnn(), train);
  Executor executor(trainer.train_plan(), executor_options(Policy::Auto, 2));
  while (!executor.profiled()) executor.run();
  Trace trace;  // the trial steps (model, intra, narrow and serial schedules), then the chosen one
  trainer.train_plan().set_trace(&trace);
  int most_running = 0;
  while (!executor.tuned()) {
    executor.run();
    EXPECT_LE(executor.peak_threads(), 2);
    most_running = std::max(most_running, executor.peak_running());
  }
  for (int step = 0; step < 3; ++step) executor.run();
  // The narrow trial schedule (one thread per op) launches independent ops side by side (whether
  // the OS runs them at the same instant depends on the machine's load, so the trace cannot
  // promise it).
  EXPECT_GE(most_running, 2) << "no op of the CNN step was launched beside another";
  trainer.train_plan().set_trace(nullptr);
  std::vector<TraceEvent> events = trace.events();
  ASSERT_FALSE(events.empty());
  for (const TraceEvent& e : events) {
    // Threads granted to everything running at e's start (e included).
    int granted = 0;
    for (const TraceEvent& other : events)
      if (other.start_us <= e.start_us && e.start_us < other.start_us + other.duration_us) granted += other.granted_threads;
    granted = std::max(granted, e.granted_threads);
    EXPECT_LE(granted, 2) << e.name << " started while ops granted " << granted << " threads ran";
  }
}

const bool registered_throwing_op = [] {
  OpDef def;
  def.kind = "test_throws";
  def.infer = [](const InferContext& ctx) { return std::vector<TensorType>{ctx.inputs[0]}; };
  def.kernels.push_back(cpu_kernel("reference", [](const KernelCall& call) {
    throw Error(cat("deliberate failure in '", call.node.name, "'"));
  }));
  return register_op(std::move(def));
}();

TEST(Executor, ThrowingKernelCancelsTheStepAndNamesTheNode) {
  GraphBuilder b;
  Value x = b.input("x", Shape{32, 32});
  Value left = x, right = x;
  for (int i = 0; i < 10; ++i) left = b.tanh(left);
  Value bad = b.apply1("test_throws", {x}, {}, "the_bad_node");
  for (int i = 0; i < 10; ++i) right = b.sigmoid(right);
  Value joined = b.add(left, right);
  Value out = b.add(joined, bad);
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {out});
  const std::string last = b.graph().node(b.graph().value(out.id).producer).name;  // reads the bad node
  const std::string join = b.graph().node(b.graph().value(joined.id).producer).name;  // does not
  for (Policy policy : {Policy::Serial, Policy::Intra, Policy::Fixed, Policy::Auto}) {
    SCOPED_TRACE(name_of(policy));
    Trace trace;
    plan.set_trace(&trace);
    Executor executor(plan, executor_options(policy, 2, 2, 1));
    for (int attempt = 0; attempt < 6; ++attempt) {  // the executor stays usable after an error
      try {
        executor.run();
        FAIL() << "the step must fail";
      } catch (const Error& error) {
        EXPECT_NE(std::string(error.what()).find("the_bad_node"), std::string::npos) << error.what();
      }
    }
    // Cancelled: nothing that needs the failed node's output ever started.
    const std::vector<TraceEvent> events = trace.events();
    EXPECT_FALSE(events.empty()) << "the other ops are traced";
    for (const TraceEvent& event : events) EXPECT_NE(event.name, last) << "'" << last << "' ran after the failure";
    // And nothing else starts once an op has failed. One op at a time the order is known: the two
    // chains (bottom levels 12 down to 3 units), then the bad node and `join` (2 units each, a tie
    // the plan order breaks: the bad node first). So `join`, ready then, is cancelled every time:
    // each step traces the 20 chain ops and no more.
    if (policy == Policy::Serial) {
      for (const TraceEvent& event : events) EXPECT_NE(event.name, join) << "'" << join << "' started after the failure";
      EXPECT_EQ(events.size(), 6u * 20u);
    }
    plan.set_trace(nullptr);
  }
}

TEST(Executor, ThousandConsecutiveSteps) {
  TrainOptions options;
  options.batch = 4;
  options.eval_batch = 4;
  options.policy = "auto";
  options.threads = 2;
  options.profile_samples = 1;
  Trainer trainer(models::mlp(), options);
  std::vector<float> images(4 * 784);
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>((i * 7919) % 255) / 255.0f;
  std::vector<int32_t> labels = {1, 3, 5, 7};
  TrainOptions reference_options = options;
  reference_options.policy = "";  // Plan::run, one thread
  reference_options.threads = 1;
  Trainer reference(models::mlp(), reference_options);
  double loss = 0.0;
  for (int step = 0; step < 1000; ++step) {
    loss = trainer.train_step(images.data(), labels.data());
    reference.train_step(images.data(), labels.data());
  }
  EXPECT_LT(loss, 0.01);  // four fixed samples are memorised
  EXPECT_TRUE(trainer.executor()->profiled());
  // Long past profiling and trials, the settled schedule computes what the serial reference does.
  const Tensor &w = trainer.params().flat_params(), &r = reference.params().flat_params();
  for (int64_t i = 0; i < w.numel(); ++i)
    ASSERT_NEAR(w.f32()[i], r.f32()[i], 1e-3 * std::abs(r.f32()[i]) + 1e-4) << "parameter " << i;
}

using testing::limit_address_space_to_now_plus;

// Lanes that cannot all start (here: no address space left for their stacks) are a quiver::Error
// naming the lane, and the lanes already started are stopped and joined: once the half-made
// executor's condition variables were destroyed under waiting lanes, and the run hung. Run in a
// child process (a death test) with its address space capped; the alarm turns a hang into a
// failure. Not under sanitizers, whose shadow memory a cap on the address space breaks.
TEST(Executor, LanesThatCannotStartAreAnErrorNotAHang) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "caps the address space, which a sanitizer's shadow memory needs";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  GraphBuilder b;
  Value x = b.input("x", Shape{4, 4});
  Value y = b.relu(x);
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {y});
  EXPECT_EXIT(
      {
        alarm(30);
        limit_address_space_to_now_plus(int64_t{96} << 20);  // room for a few 8 MiB stacks
        try {
          Executor executor(plan, executor_options(Policy::Fixed, 1, 2000, 1));
        } catch (const Error& error) {
          std::fprintf(stderr, "%s\n", error.what());
          std::_Exit(3);
        }
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(3), "executor: cannot start lane thread [0-9]+ of 1999");
#endif
}

// inter x intra above the cores (quiver-train warns that they take turns): while the executor lives
// TBB may run every lane's workers at once, so two ops side by side each get their intra threads
// (ThreadBudget.BudgetsSideBySideUseAllTheirThreadsUnderAnAllowance shows what that buys); once
// it is gone the limit is back where it was.
TEST(Executor, AFixedPolicyAboveTheCoresMayRunAllItsThreads) {
  const int k = std::max(2, available_cores());
  const int limit_before = thread_limit();
  GraphBuilder b;
  Value x = b.input("x", Shape{4, 4});
  Value y = b.add(b.relu(x, "left"), b.relu(x, "right"));
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {y});
  {
    Executor executor(plan, executor_options(Policy::Fixed, 2 * k, 2, k));
    EXPECT_GE(thread_limit(), 2 * (k - 1) + 1);
    plan.input("x").fill(1.0f);
    executor.run();
    EXPECT_EQ(plan.tensor(y).f32()[0], 2.0f);
  }
  EXPECT_EQ(thread_limit(), limit_before);
}

TEST(Executor, RejectsBadPolicies) {
  EXPECT_THROW(parse_policy("auto-magic"), Error);
  TrainOptions options;
  options.batch = 4;
  options.eval_batch = 4;
  options.policy = "fixed";
  options.inter = 0;
  EXPECT_THROW(Trainer(models::mlp(), options), Error);
  // More threads than the performance model describes: refused, not profiled at counts that
  // overflow an int (the model's doubling series once ran away past 2^30).
  GraphBuilder b;
  Value y = b.relu(b.input("x", Shape{4}));
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {y});
  for (Policy policy : {Policy::Auto, Policy::Intra}) {
    try {
      Executor executor(plan, executor_options(policy, (1 << 30) + 1));
      ADD_FAILURE() << name_of(policy) << " accepted 2^30 + 1 threads";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("1073741825 threads is more than 65536"), std::string::npos)
          << error.what();
    }
  }
  EXPECT_THROW(PerfModel(PerfModel::kMostThreads + 1), Error);
  EXPECT_EQ(PerfModel(PerfModel::kMostThreads).profiled_counts().back(), PerfModel::kMostThreads);
  // A trial that could never end (it would cycle through serial stints for good), a NaN that
  // would silently turn retrials off, and trials of no steps are refused.
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double seconds : {nan, inf, -1.0}) {
    ExecutorOptions trial = executor_options(Policy::Auto, 2), retrial = trial;
    trial.trial_seconds = seconds;
    retrial.retrial_seconds = seconds;
    EXPECT_THROW(Executor(plan, trial), Error) << seconds;
    EXPECT_THROW(Executor(plan, retrial), Error) << seconds;
  }
  ExecutorOptions no_rounds = executor_options(Policy::Auto, 2), no_stint = no_rounds;
  no_rounds.trial_rounds = 0;
  no_stint.trial_stint = 0;
  EXPECT_THROW(Executor(plan, no_rounds), Error);
  EXPECT_THROW(Executor(plan, no_stint), Error);
  // Counts the tuning adds up in an int (tuning_runs_left read -2147483572), and a grant's slack
  // that no time is within.
  ExecutorOptions long_stint = executor_options(Policy::Auto, 2), long_warmup = long_stint;
  long_stint.trial_stint = std::numeric_limits<int>::max();
  long_warmup.profile_warmup = std::numeric_limits<int>::max();
  EXPECT_THROW(Executor(plan, long_stint), Error);
  EXPECT_THROW(Executor(plan, long_warmup), Error);
  for (double slack : {nan, -1e-6, inf}) {
    ExecutorOptions bad = executor_options(Policy::Auto, 2);
    bad.grant_slack_s = slack;
    EXPECT_THROW(Executor(plan, bad), Error) << slack;
  }
}

}  // namespace
}  // namespace quiver
