// Shape, DType and Device: the small value types every other part of Quiver speaks.
// A Shape is a list of extents known when the graph is built (a Plan is compiled for one batch
// size), so nothing here is symbolic.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace quiver {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int axis) const { return dims_.at(axis < 0 ? axis + rank() : axis); }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t numel() const;
  bool operator==(const Shape& other) const { return dims_ == other.dims_; }
  bool operator!=(const Shape& other) const { return dims_ != other.dims_; }
  std::string str() const;  // "[64,784]"; a scalar is "[]"

 private:
  std::vector<int64_t> dims_;
};

enum class DType { F32, I32 };

inline int64_t size_of(DType dtype) { return 4; }
inline const char* name_of(DType dtype) { return dtype == DType::F32 ? "f32" : "i32"; }

enum class DeviceKind { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceKind::CUDA, index}; }
  // "cpu", "cuda" (device 0) or "cuda:N"; throws quiver::Error naming the text otherwise.
  static Device parse(const std::string& text);
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool operator==(const Device& other) const = default;
  std::string str() const;
};

}  // namespace quiver
