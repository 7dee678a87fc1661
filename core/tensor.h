// Tensor: a typed, shaped view of shared storage. Storage is 64-byte aligned CPU memory, or device
// memory from the device's backend (core/device.h); data pointers of a device tensor are device
// pointers, meaningful to that device's kernels only. Views
// (reshape, a slice of a flat parameter buffer) share it, so a replica's parameters can be one
// allocation with a tensor per parameter. Tensors carry no autograd state: gradients are graph
// values, not tensor fields.
#pragma once

#include <cstdint>
#include <memory>

#include "core/shape.h"

namespace quiver {

class Storage {
 public:
  explicit Storage(int64_t bytes, Device device = Device::cpu());
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  // A view of `storage` starting `offset` elements in; the caller guarantees it fits.
  Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return shape_.numel(); }
  int64_t bytes() const { return numel() * size_of(dtype_); }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }

  // Same storage, another shape with the same element count.
  Tensor view(const Shape& shape) const;
  // `shape.numel()` elements starting `offset` elements into this tensor.
  Tensor slice(int64_t offset, const Shape& shape) const;

  // Typed element pointers; the wrong type's (an int32 tensor's f32()) throws quiver::Error
  // naming both, rather than handing its bits out as the other type. raw() is untyped.
  float* f32() const {
    if (dtype_ != DType::F32) wrong_dtype(DType::F32);
    return static_cast<float*>(raw());
  }
  int32_t* i32() const {
    if (dtype_ != DType::I32) wrong_dtype(DType::I32);
    return static_cast<int32_t*>(raw());
  }
  void* raw() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // Both work across devices (synchronously, through the device's backend).
  void fill(float value) const;
  void copy_from(const Tensor& src) const;
  // A CPU copy of this tensor (itself when it is on the CPU already).
  Tensor to_cpu() const;

 private:
  [[noreturn]] void wrong_dtype(DType asked) const;

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
};

}  // namespace quiver
