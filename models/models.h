// The bundled models of DESIGN.md section 4 (the examples' and benchmarks' workloads), written
// only with the public module API. Each returns logits (B, 10).
#pragma once

#include <string>
#include <vector>

#include "core/nn.h"

namespace quiver::models {

ModelSpec mlp();   // 784 -> 512 -> ReLU -> 256 -> ReLU -> 10
ModelSpec cnn();   // conv5x5 1->16 p2, ReLU, pool2; conv5x5 16->32 p2, ReLU, pool2; 1568 -> 128 -> ReLU -> 10
ModelSpec lstm();  // LSTM(28 -> 128) over 28 rows; last hidden -> 10

std::vector<std::string> names();               // "mlp", "cnn", "lstm"
ModelSpec by_name(const std::string& name);     // throws quiver::Error listing the names

}  // namespace quiver::models
