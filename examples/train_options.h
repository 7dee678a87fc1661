// Command-line options of quiver-train, parsed into a TrainCommand. Every bad value throws
// quiver::Error naming the flag and what was wrong, so the program can print it and exit 2.
#pragma once

#include <string>
#include <vector>

#include "runtime/learners.h"
#include "runtime/trainer.h"

namespace quiver {

struct TrainCommand {
  std::string model = "mlp";
  std::string data_dir;  // empty: default_fashion_mnist_dir()
  TrainOptions train;
  bool help = false;
  bool quiet = false;  // no live progress line
  bool explain = false;  // print the executor's per-op report after training
  // Multi-learner training (SMA): learners 0 trains one model on one stream (no SMA).
  int learners = 0;
  bool learners_auto = false;     // --learners auto: tuned while training
  int threads_per_learner = 0;    // 0: --threads (default: the cores) split evenly among the learners
  double alpha = -1.0;            // SMA correction weight; negative: 1/k
  double mu_z = -1.0;             // SMA: momentum of the average model's move; negative: 0.9
  std::string sync = "sma";
  int staleness = 0;              // the clock gate: learners up to this many rounds apart (0: synchronous)
  int sync_period = 1;            // SMA every this many rounds (1: every round)
  LrScaling lr_scaling = LrScaling::None;  // --lr-scaling: how k learners' lr follows k
  int gpus = 1;  // with --device cuda and --learners: learners spread over this many GPUs
  std::string checkpoint;  // with --learners: save the average model here after training
  std::string resume;      // with --learners: start from this checkpoint
  std::vector<std::string> warnings;  // valid but unwise choices (more threads than cores), to print
};

TrainCommand parse_train_command(const std::vector<std::string>& args);
// With --learners N: the threads each learner gets (--threads-per-learner, else an even share of
// --threads, at least one).
int learner_threads(const TrainCommand& command);
std::string train_usage();
// The progress line's ETA, minutes:seconds ("12:05"); at least 10^9 seconds (a first step timed
// while profiling, with a long run ahead) reads ">16666666:40" rather than wrapping.
std::string clock_text(double seconds);

}  // namespace quiver
