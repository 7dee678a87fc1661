#include "runtime/learners.h"

#include <algorithm>

#include "core/error.h"

namespace quiver {

LearnerGroup::LearnerGroup(ModelSpec model, TrainOptions train, LearnerOptions options) {
  if (options.learners < 1) throw Error(cat("learners: need at least 1, got ", options.learners));
  if (options.threads_per_learner < 1)
    throw Error(cat("threads per learner: need at least 1, got ", options.threads_per_learner));
  batch_ = train.batch;
  features_ = model.sample_shape.numel();
  TrainOptions replica = train;
  replica.threads = options.threads_per_learner;
  replica.eval_batch = 1;  // learners never evaluate; keep their evaluation plans small
  for (int j = 0; j < options.learners; ++j) {
    auto learner = std::make_unique<Learner>();
    learner->trainer = std::make_unique<Trainer>(model, replica);
    learner->snapshot = Tensor::zeros(learner->trainer->params().flat_params().shape(), DType::F32);
    learners_.push_back(std::move(learner));
  }
  TrainOptions average = train;
  average.policy = "";  // evaluation only: no executor
  average.threads = options.threads_per_learner;
  average_ = std::make_unique<Trainer>(model, average);
  sma_ = std::make_unique<SmaSync>(average_->params().flat_params(), options.learners, options.sma);
  sync_budget_ = std::make_unique<ThreadBudget>(std::min(options.learners * options.threads_per_learner, available_cores()));
}

LearnerGroup::~LearnerGroup() = default;

const Tensor& LearnerGroup::average() const { return sma_->average(); }

double LearnerGroup::round(const float* images, const int32_t* labels) {
  for (size_t j = 0; j < learners_.size(); ++j) {
    Learner& learner = *learners_[j];
    const float* batch_images = images + static_cast<int64_t>(j) * batch_ * features_;
    const int32_t* batch_labels = labels + static_cast<int64_t>(j) * batch_;
    learner.stream.submit([&learner, batch_images, batch_labels] {
      const Tensor& params = learner.trainer->params().flat_params();
      std::copy_n(params.f32(), params.numel(), learner.snapshot.f32());
      learner.loss = learner.trainer->train_step(batch_images, batch_labels);
    });
  }
  std::exception_ptr first_error;
  for (auto& learner : learners_) {
    try {
      learner->stream.wait();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
  std::vector<Tensor> params, snapshots;
  double loss = 0.0;
  for (auto& learner : learners_) {
    params.push_back(learner->trainer->params().flat_params());
    snapshots.push_back(learner->snapshot);
    loss += learner->loss;
  }
  sma_->round(params, snapshots, *sync_budget_);
  return loss / static_cast<double>(learners_.size());
}

double LearnerGroup::evaluate(const Dataset& data) { return average_->evaluate(data); }

void LearnerGroup::reset_replicas() {
  std::vector<Tensor> params;
  for (auto& learner : learners_) params.push_back(learner->trainer->params().flat_params());
  sma_->reset_replicas(params);
}

}  // namespace quiver
