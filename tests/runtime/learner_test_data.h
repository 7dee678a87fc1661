// Small synthetic data, a one-thread serial recipe, staleness options and the textbook's side of
// two learners (plain trainers and SmaSync) for the learner and checkpoint tests.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/learners.h"
#include "runtime/sma.h"
#include "runtime/trainer.h"

namespace quiver::learner_test {

// `samples` random 28x28 images in [0, 1) and labels in [0, 10), from `seed`.
struct Batches {
  explicit Batches(int64_t samples, int seed = 5) : images(samples * 784), labels(samples) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    for (float& v : images) v = pixel(rng);
    for (int32_t& l : labels) l = static_cast<int32_t>(rng() % 10);
  }
  std::vector<float> images;
  std::vector<int32_t> labels;
};

// `data`'s samples as a Dataset.
inline Dataset dataset_of(const Batches& data) {
  Dataset set;
  set.count = static_cast<int64_t>(data.labels.size()), set.rows = 28, set.cols = 28;
  set.images = data.images;
  set.labels = data.labels;
  return set;
}

// The samples of Batches(count, seed) as a Dataset.
inline Dataset small_dataset(int64_t count, int seed) { return dataset_of(Batches(count, seed)); }

// A tensor of its own with t's values.
inline Tensor copy_of(const Tensor& t) {
  Tensor copy = Tensor::zeros(t.shape());
  copy.copy_from(t);
  return copy;
}

// Batch 8, the serial policy on one thread: results do not depend on timing.
inline TrainOptions recipe() {
  TrainOptions train;
  train.batch = 8;
  train.eval_batch = 8;
  train.policy = "serial";
  train.threads = 1;
  return train;
}

// A group of `learners` one-thread learners under SMA (alpha, mu_z 0.9) with a staleness bound.
inline LearnerOptions stale(int learners, int staleness, double alpha = -1.0) {
  LearnerOptions options{learners, 1, SmaOptions{alpha, 0.9}};
  options.staleness = staleness;
  return options;
}

// Two one-thread learners under SMA (alpha 1/2, mu_z 0.9) that sync every `period` rounds.
inline LearnerOptions two_syncing_every(int period) {
  LearnerOptions options{2, 1, SmaOptions{0.5, 0.9}};
  options.sync_period = period;
  return options;
}

// The textbook's side of two CPU learners of batch 8: two plain trainers, each stepping on its
// half of a round's samples; `params` and `snapshots` (from before the last step) are what
// SmaSync::round() averages.
struct PlainPair {
  explicit PlainPair(const ModelSpec& model, const TrainOptions& train = recipe()) {
    for (int j = 0; j < 2; ++j) trainers.push_back(std::make_unique<Trainer>(model, train));
  }
  void step(const Batches& data) {
    params.clear(), snapshots.clear();
    for (int j = 0; j < 2; ++j) {
      params.push_back(trainers[j]->params().flat_params());
      snapshots.push_back(copy_of(params[j]));
      trainers[j]->train_step(data.images.data() + j * 8 * 784, data.labels.data() + j * 8);
    }
  }
  const Tensor& w(int j) const { return trainers[j]->params().flat_params(); }
  std::vector<std::unique_ptr<Trainer>> trainers;
  std::vector<Tensor> params, snapshots;
};

// `rounds` rounds of `group` beside the plain pair's steps, each followed by the textbook round.
inline void rounds_in_lockstep(LearnerGroup& group, PlainPair& plain, SmaSync& textbook, const Batches& data,
                               int rounds) {
  for (int round = 0; round < rounds; ++round) {
    group.round(data.images.data(), data.labels.data());
    plain.step(data);
    textbook.round(plain.params, plain.snapshots);
  }
}

// The step a "training stopped: loss is nan at step N" error names; -1 when it names none.
inline int64_t step_named(const Error& error) {
  const std::string message = error.what();
  const size_t at = message.find("at step ");
  if (at == std::string::npos) return -1;
  const size_t digits = at + 8;
  const size_t end = message.find_first_not_of("0123456789", digits);
  return end == digits ? -1 : std::stoll(message.substr(digits, end - digits));
}

}  // namespace quiver::learner_test
