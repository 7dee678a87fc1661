// LearnerGroup's checkpoints of the average model z: written atomically with a checksum
// (runtime/checkpoint.h); a load verifies the file before it touches the running model.
#include "core/error.h"
#include "core/log.h"
#include "runtime/checkpoint.h"
#include "runtime/learners.h"

namespace quiver {

void LearnerGroup::save(const std::string& path) const {
  const Tensor& z = average();  // every learner settled, the device SMA drained
  // Under a sync period z holds the rounds up to the last sync only (fit() folds the local steps
  // in at each epoch's end; a save from an eval_every evaluation, or after round(), may come
  // between syncs). The file records that point, so a resumed run trains the rounds since then
  // again rather than skipping samples z never learned from. (Folding here instead would make a
  // save change the training that follows it.) No epoch ends between syncs inside fit().
  const bool local_steps = options_.sync == Sync::Sma && !alone() && options_.sync_period > 1;
  const int64_t unsynced = local_steps ? rounds_done_ - last_sync_round_ : 0;
  CheckpointInfo info;
  info.model = model_.name;
  info.rounds = rounds_done_ - unsynced;
  info.epochs_done = unsynced > 0 ? epochs_done_at_sync_ : epochs_done_;
  info.epoch_samples = unsynced > 0 ? epoch_samples_at_sync_ : epoch_samples_done_;
  info.seed = train_.seed;
  info.seed_known = true;
  info.data_samples = info.epoch_samples > 0 ? epoch_data_samples_ : 0;
  save_checkpoint(path, average_->params(), z, info);
}

void LearnerGroup::load(const std::string& path) {
  if (fitting_)
    throw Error(cat("checkpoint '", path, "': not loaded: load() called from a fit() callback (fit() would go on "
                    "counting its own rounds and epochs; load between fit()s)"));
  // Read into a scratch buffer first: a bad file leaves the running model untouched.
  const Tensor& z = average_->params().flat_params();
  Tensor scratch = Tensor::zeros(z.shape(), DType::F32);
  CheckpointInfo info = load_checkpoint(path, average_->params(), scratch, model_.name);
  // The learners finish what they were given. An error of theirs not yet reported (under a
  // staleness bound: the NaN loss a load is the recovery from) is dropped with a warning once
  // every replica has restarted from the file's z; if they cannot be rebuilt, it stands, and the
  // error says so.
  std::string learner_error;
  try {
    settle();
  } catch (const std::exception& error) {
    learner_error = error.what();
  }
  drain();
  refresh_average();
  // build() starts every replica from z; if it refuses (memory), z goes back and nothing changed.
  const Tensor previous = z.to_cpu();  // on the host: device memory is what build() may run short of
  const int64_t previous_rounds = rounds_done_;
  z.copy_from(scratch);
  rounds_done_ = info.rounds;  // before build(): a traced replica numbers its steps from it
  try {
    build(learners(), threads_per_learner_);
  } catch (const std::exception& error) {
    z.copy_from(previous);
    rounds_done_ = previous_rounds;
    if (learner_error.empty()) throw;
    throw Error(cat(error.what(), " (and a learner's error from before the load still stands: ", learner_error, ")"));
  } catch (...) {  // a custom kernel's prepare may throw anything
    z.copy_from(previous);
    rounds_done_ = previous_rounds;
    throw;
  }
  if (!learner_error.empty())
    warn(cat("load '", path, "': dropped a learner's error from before the load: ", learner_error));
  average_stale_ = false;  // z is the checkpoint's now, not the replica's
  if (ssgd_velocity_.defined()) ssgd_velocity_.fill(0.0f);  // momentum restarts, as the replicas' does
  // A cut epoch goes on in its own order, which its seed decides; under another seed it starts again.
  set_epoch_position(info.epochs_done, info.epoch_samples);  // build() above left z holding every round: a sync
  epoch_data_samples_ = info.data_samples;
  if (epoch_samples_done_ > 0 && (!info.seed_known || info.seed != train_.seed)) {
    warn(cat("checkpoint '", path, "' was saved ", epoch_samples_done_, " samples into epoch ", epochs_done_ + 1,
             info.seed_known ? cat(" of seed ", info.seed, "; this run's seed is ", train_.seed)
                             : std::string(" without its data order's seed"),
             ": that epoch starts again"));
    set_epoch_samples(0);
  }
}

}  // namespace quiver
