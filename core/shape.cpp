#include "core/shape.h"

#include "core/error.h"

namespace quiver {

int64_t Shape::numel() const {
  int64_t count = 1;
  for (int64_t extent : dims_)
    if (__builtin_mul_overflow(count, extent, &count)) throw Error(cat("shape ", str(), ": more elements than int64 holds"));
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

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() < 9 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos)
    return cuda(std::stoi(text.substr(5)));
  throw Error(cat("unknown device '", text, "': expected cpu, cuda or cuda:N"));
}

}  // namespace quiver
