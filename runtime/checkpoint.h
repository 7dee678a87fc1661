// Checkpoints of a model's parameters (for multi-learner training: the average model z). One
// file: a magic line, a JSON header (model name, every parameter's name, shape and offset, the
// flat size, training progress), the flat float32 buffer, and a CRC-32 of everything before it.
// Written atomically; on load the magic, the header, the sizes, the checksum and the parameter
// layout are all verified, and any mismatch is a quiver::Error naming the file and the problem.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "runtime/param_store.h"

namespace quiver {

struct CheckpointInfo {
  std::string model;
  int64_t rounds = 0;         // training rounds (steps) done
  int64_t epochs_done = 0;    // complete epochs done
  int64_t epoch_samples = 0;  // samples of epoch epochs_done + 1 trained already (it was cut short)
  // The data order's seed: a cut epoch goes on in its order only under the same seed. Checkpoints
  // written before it was recorded have none (seed_known false).
  uint64_t seed = 0;
  bool seed_known = false;
  // The size of the training set whose order that cut epoch followed (0: not recorded): a data
  // set of another size has another order, in which the epoch starts again.
  int64_t data_samples = 0;
};

// Writes `flat` (laid out as `layout`'s parameters) to `path` atomically.
void save_checkpoint(const std::string& path, const ParamStore& layout, const Tensor& flat, const CheckpointInfo& info);
// Reads `path` into `flat`, which must have `layout`'s parameters; returns the stored info.
CheckpointInfo load_checkpoint(const std::string& path, const ParamStore& layout, const Tensor& flat,
                               const std::string& model);

}  // namespace quiver
