// softmax_cross_entropy(logits (B, C), labels (B) int32) -> loss (), probabilities (B, C):
// the mean over the batch of -log softmax(logits)[label]. The probabilities are kept for the
// gradient, softmax_cross_entropy_grad = (probabilities - onehot(labels)) * dloss / B.
// The per-element pieces are QUIVER_HD functions shared by the CPU and CUDA kernels; the row sums
// are in double on both.
#pragma once

#include <cmath>

#include "ops/kernel_util.h"

namespace quiver::math {

// One unnormalized probability, shifted by the row's largest logit so that exp cannot overflow.
QUIVER_HD inline float softmax_shifted_exp(float logit, float max_logit) {
  return std::exp(logit - max_logit);
}
// A probability from its shifted exp and the row's sum of them.
QUIVER_HD inline float softmax_normalize(float shifted_exp, double sum) {
  return static_cast<float>(shifted_exp / sum);
}
// -log softmax(logits)[label] of one row: log(sum) + (max - logit[label]). The two logits are
// subtracted first, exactly in double: added to a max of 1e20 first, log(sum) would be lost.
QUIVER_HD inline double softmax_cross_entropy_row(double sum, float max_logit, float label_logit) {
  return std::log(sum) + (static_cast<double>(max_logit) - static_cast<double>(label_logit));
}
// d loss / d logit of one element, with scale = dloss / B.
QUIVER_HD inline float softmax_cross_entropy_grad(float probability, bool is_label, float scale) {
  return (probability - (is_label ? 1.0f : 0.0f)) * scale;
}

}  // namespace quiver::math
