// Tensor: a typed, shaped view of shared storage. Storage is 64-byte aligned CPU memory; views
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
  explicit Storage(int64_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype = DType::F32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32);
  // A view of `storage` starting `offset` elements in; the caller guarantees it fits.
  Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return shape_.numel(); }
  int64_t bytes() const { return numel() * size_of(dtype_); }

  // Same storage, another shape with the same element count.
  Tensor view(const Shape& shape) const;
  // `shape.numel()` elements starting `offset` elements into this tensor.
  Tensor slice(int64_t offset, const Shape& shape) const;

  float* f32() const { return static_cast<float*>(raw()); }
  int32_t* i32() const { return static_cast<int32_t*>(raw()); }
  void* raw() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  void fill(float value) const;
  void copy_from(const Tensor& src) const;

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
};

}  // namespace quiver
