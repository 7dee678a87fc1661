// LearnerGroup: k replicas of a model ("learners") trained at once and kept consistent by
// synchronous model averaging (Crossbow; DESIGN.md section 3, "Learners and SMA"). A learner owns
// one replica's flat buffers (parameters, gradients, momentum) through its own Trainer, a
// pre-step snapshot of its parameters, its compiled plan and executor (the thread budget it was
// granted), and a stream on which its steps run. A round gives every learner one batch, runs the
// k steps at once, waits, then applies SMA; z, the average model, is what is evaluated.
//
// What it is not yet (issue 4 continues): the task scheduler with a clock gate and a feeder for
// all learners, synchronous SGD, the auto-tuner of k, checkpoints, and the CLI.
#pragma once

#include <memory>
#include <vector>

#include "runtime/cpu_stream.h"
#include "runtime/sma.h"
#include "runtime/thread_budget.h"
#include "runtime/trainer.h"

namespace quiver {

struct LearnerOptions {
  int learners = 2;
  int threads_per_learner = 1;  // each learner's executor gets this many threads
  SmaOptions sma;
};

class LearnerGroup {
 public:
  // `train` is the recipe of every learner (batch = per-learner batch, policy, seed: every
  // replica and z start from the same seeded parameters); its `threads` is ignored.
  LearnerGroup(ModelSpec model, TrainOptions train, LearnerOptions options);
  ~LearnerGroup();

  int learners() const { return static_cast<int>(learners_.size()); }
  // One round: learner j trains on samples [j*b, (j+1)*b) of `images` / `labels` (b the
  // per-learner batch), all learners at once; then SMA. Returns the learners' mean loss. A
  // learner's error (a NaN loss) is rethrown after every learner has finished its step.
  double round(const float* images, const int32_t* labels);
  // z, the average model, as a flat buffer shaped like every replica's parameters.
  const Tensor& average() const;
  ParamStore& replica(int j) { return learners_.at(j)->trainer->params(); }
  // Top-1 accuracy of z.
  double evaluate(const Dataset& data);
  // Every replica becomes z (after a learning-rate drop).
  void reset_replicas();

 private:
  struct Learner {
    std::unique_ptr<Trainer> trainer;
    Tensor snapshot;  // parameters before this round's step (s_j)
    double loss = 0.0;
    CpuStream stream;
  };
  std::vector<std::unique_ptr<Learner>> learners_;
  std::unique_ptr<Trainer> average_;  // its parameters are z; used for evaluation only
  std::unique_ptr<SmaSync> sma_;
  std::unique_ptr<ThreadBudget> sync_budget_;  // the sync runs between rounds on all learners' threads
  int64_t batch_ = 0, features_ = 0;
};

}  // namespace quiver
