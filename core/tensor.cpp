#include "core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace quiver {

namespace {
constexpr int64_t kAlignment = 64;
}

Storage::Storage(int64_t bytes) : bytes_(bytes) {
  int64_t rounded = std::max<int64_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  data_ = std::aligned_alloc(kAlignment, static_cast<size_t>(rounded));
  if (!data_) throw Error(cat("out of memory allocating ", bytes, " bytes"));
}

Storage::~Storage() { std::free(data_); }

Tensor::Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, DType dtype)
    : storage_(std::move(storage)), offset_(offset), shape_(std::move(shape)), dtype_(dtype) {}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  return Tensor(std::make_shared<Storage>(shape.numel() * size_of(dtype)), 0, shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor tensor = empty(shape, dtype);
  std::memset(tensor.raw(), 0, static_cast<size_t>(tensor.bytes()));
  return tensor;
}

void* Tensor::raw() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * size_of(dtype_);
}

Tensor Tensor::view(const Shape& shape) const {
  if (shape.numel() != numel())
    throw Error(cat("view: cannot view ", shape_.str(), " as ", shape.str()));
  return Tensor(storage_, offset_, shape, dtype_);
}

Tensor Tensor::slice(int64_t offset, const Shape& shape) const {
  if (offset < 0 || offset + shape.numel() > numel())
    throw Error(cat("slice: ", shape.str(), " at ", offset, " does not fit in ", shape_.str()));
  return Tensor(storage_, offset_ + offset, shape, dtype_);
}

void Tensor::fill(float value) const {
  if (dtype_ == DType::F32) {
    std::fill_n(f32(), numel(), value);
  } else {
    std::fill_n(i32(), numel(), static_cast<int32_t>(value));
  }
}

void Tensor::copy_from(const Tensor& src) const {
  if (src.numel() != numel() || src.dtype() != dtype_)
    throw Error(cat("copy: ", src.shape().str(), " ", name_of(src.dtype()), " into ", shape_.str(),
                    " ", name_of(dtype_)));
  std::memcpy(raw(), src.raw(), static_cast<size_t>(bytes()));
}

}  // namespace quiver
