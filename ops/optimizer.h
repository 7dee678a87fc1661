// Optimizer updates as ops: sgd_update and adam_update write a parameter and its state in place
// (they have no outputs). Each runs over one parameter's slice of the replica's flat buffers; the
// runtime orders it after every reader of the parameter. The per-element math is here, once.
#pragma once

#include <cmath>

#include "core/graph.h"
#include "ops/kernel_util.h"

namespace quiver::math {

// Momentum SGD as Crossbow writes it: v = mu*v - lr*(g + wd*w); w = w + v.
QUIVER_HD inline void sgd_step(float& w, float& v, float g, float lr, float momentum, float wd) {
  v = momentum * v - lr * (g + wd * w);
  w += v;
}

// Adam's bias corrections for update `step` (1-based): 1/(1 - beta^step) for each moment. They
// are the same for every element, so a kernel computes them once per update (in double), not per
// element: a powf per element kept the loop scalar and cost more than the step's GEMMs.
struct AdamCorrection {
  float first, second;  // no initialisers: CUDA kernels keep one in __shared__ memory
};

QUIVER_HD inline AdamCorrection adam_correction(float beta1, float beta2, float step) {
  return {static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step)))),
          static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step))))};
}

// Adam with bias correction (`correction` from adam_correction for this update's step).
QUIVER_HD inline void adam_step(float& w, float& m, float& v, float g, float lr, float beta1,
                                float beta2, float epsilon, float wd, AdamCorrection correction) {
  g += wd * w;
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * g * g;
  const float m_hat = m * correction.first;
  const float v_hat = v * correction.second;
  w -= lr * m_hat / (std::sqrt(v_hat) + epsilon);
}

}  // namespace quiver::math

namespace quiver {

// adam_update's hyperparameters, read from its node's attributes when a kernel is prepared.
struct AdamAttrs {
  float beta1 = 0.0f, beta2 = 0.0f, epsilon = 0.0f, weight_decay = 0.0f;
};

inline AdamAttrs adam_attrs(const Attrs& a) {
  return {static_cast<float>(a.get_float("beta1")), static_cast<float>(a.get_float("beta2")),
          static_cast<float>(a.get_float("epsilon")), static_cast<float>(a.get_float("weight_decay", 0.0))};
}

}  // namespace quiver
