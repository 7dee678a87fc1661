// Reverse-mode autodiff over the static graph, and optimizer updates as graph nodes.
// Backward is emitted as ordinary nodes (each OpDef writes its own gradient beside its forward),
// so the executor sees the backward graph's parallelism. Gradients of values read more than once
// are summed. Each parameter's final gradient becomes a ParamGrad value: a view of the replica's
// flat gradient buffer.
#pragma once

#include "core/builder.h"

namespace quiver {

// Appends d(loss)/d(parameter) for every parameter; `loss` must be a scalar.
void build_backward(GraphBuilder& builder, Value loss);

struct SgdOptions {
  double momentum = 0.9;
  double weight_decay = 0.0;
};

struct AdamOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double weight_decay = 0.0;
};

// One in-place update node per parameter (after build_backward), reading the learning rate from
// `learning_rate`, a (1) input the trainer sets each step (Adam also reads `step`, the 1-based
// update count, a (1) input, for its bias correction). Each update runs after every reader of its
// parameter.
void add_sgd_update(GraphBuilder& builder, Value learning_rate, const SgdOptions& options);
void add_adam_update(GraphBuilder& builder, Value learning_rate, Value step,
                     const AdamOptions& options);

}  // namespace quiver
