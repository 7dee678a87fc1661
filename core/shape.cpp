#include "core/shape.h"

#include "core/error.h"

namespace quiver {

int64_t Shape::numel() const {
  int64_t count = 1;
  for (int64_t extent : dims_) count *= extent;
  return count;
}

std::string Shape::str() const {
  std::string text = "[";
  for (size_t axis = 0; axis < dims_.size(); ++axis) {
    if (axis) text += ",";
    text += std::to_string(dims_[axis]);
  }
  return text + "]";
}

std::string Device::str() const {
  return kind == DeviceKind::CPU ? "cpu" : cat("cuda:", index);
}

}  // namespace quiver
