// softmax_cross_entropy(logits (B, C), labels (B) int32) -> loss (), probabilities (B, C):
// the mean over the batch of -log softmax(logits)[label]. The probabilities are kept for the
// gradient, softmax_cross_entropy_grad = (probabilities - onehot(labels)) * dloss / B.
#pragma once
