#include "core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/device.h"
#include "core/error.h"

namespace quiver {

namespace {
constexpr int64_t kAlignment = 64;
}

Storage::Storage(int64_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (bytes < 0 || bytes > std::numeric_limits<int64_t>::max() - kAlignment)
    throw Error(cat("storage of ", bytes, " bytes: not a size a buffer can have"));
  if (!device.is_cpu()) {
    data_ = backend_for(device).allocate(device.index, std::max<int64_t>(bytes, kAlignment));
    return;
  }
  int64_t rounded = std::max<int64_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  data_ = std::aligned_alloc(kAlignment, static_cast<size_t>(rounded));
  if (!data_) throw Error(cat("out of memory allocating ", bytes, " bytes"));
}

Storage::~Storage() {
  if (device_.is_cpu()) {
    std::free(data_);
  } else if (DeviceBackend* backend = device_backend(device_.kind)) {
    backend->release(device_.index, data_, std::max<int64_t>(bytes_, kAlignment));
  }
}

Tensor::Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, DType dtype)
    : storage_(std::move(storage)), offset_(offset), shape_(std::move(shape)), dtype_(dtype) {}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  int64_t bytes = 0;
  if (__builtin_mul_overflow(shape.numel(), static_cast<int64_t>(size_of(dtype)), &bytes))
    throw Error(cat("tensor of shape ", shape.str(), ": more bytes than int64 holds"));
  return Tensor(std::make_shared<Storage>(bytes, device), 0, shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor tensor = empty(shape, dtype, device);
  if (device.is_cpu())
    std::memset(tensor.raw(), 0, static_cast<size_t>(tensor.bytes()));
  else
    tensor.fill(0.0f);
  return tensor;
}

void Tensor::wrong_dtype(DType asked) const {
  throw Error(cat("a tensor of ", name_of(dtype_), " values (shape ", shape_.str(), ") read as ", name_of(asked),
                  " through ", asked == DType::F32 ? "f32()" : "i32()"));
}

void* Tensor::raw() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * size_of(dtype_);
}

namespace {

// A default Tensor has no storage, yet its shape [] counts one element: each use that reads or
// writes elements refuses it rather than follow the null pointer.
void require_defined(const Tensor& tensor, const char* what) {
  if (!tensor.defined()) throw Error(cat(what, ": the tensor is empty (a default Tensor, no storage)"));
}

bool has_negative_extent(const Shape& shape) {
  for (int64_t extent : shape.dims())
    if (extent < 0) return true;
  return false;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  require_defined(*this, "view");
  if (has_negative_extent(shape) || shape.numel() != numel())  // [-2,-2] has 4 "elements"
    throw Error(cat("view: cannot view ", shape_.str(), " as ", shape.str()));
  return Tensor(storage_, offset_, shape, dtype_);
}

Tensor Tensor::slice(int64_t offset, const Shape& shape) const {
  require_defined(*this, "slice");
  // numel() - offset, not offset + count: an offset near 2^63 would overflow past the check.
  if (offset < 0 || offset > numel() || has_negative_extent(shape) || shape.numel() > numel() - offset)
    throw Error(cat("slice: ", shape.str(), " at ", offset, " does not fit in ", shape_.str()));
  return Tensor(storage_, offset_ + offset, shape, dtype_);
}

void Tensor::fill(float value) const {
  require_defined(*this, "fill");
  if (!device().is_cpu()) {
    if (dtype_ == DType::F32) {
      backend_for(device()).fill(raw(), device().index, value, numel());
    } else {
      int32_t as_int = static_cast<int32_t>(value);
      float bits;
      std::memcpy(&bits, &as_int, sizeof bits);
      backend_for(device()).fill(raw(), device().index, bits, numel());
    }
    return;
  }
  if (dtype_ == DType::F32) {
    std::fill_n(f32(), numel(), value);
  } else {
    std::fill_n(i32(), numel(), static_cast<int32_t>(value));
  }
}

void Tensor::copy_from(const Tensor& src) const {
  require_defined(*this, "copy (into)");
  require_defined(src, "copy (from)");
  if (src.numel() != numel() || src.dtype() != dtype_)
    throw Error(cat("copy: ", src.shape().str(), " ", name_of(src.dtype()), " into ", shape_.str(),
                    " ", name_of(dtype_)));
  if (device().is_cpu() && src.device().is_cpu()) {
    std::memcpy(raw(), src.raw(), static_cast<size_t>(bytes()));
    return;
  }
  Device remote = device().is_cpu() ? src.device() : device();
  backend_for(remote).copy(raw(), device(), src.raw(), src.device(), bytes());
}

Tensor Tensor::to_cpu() const {
  require_defined(*this, "to_cpu");
  if (device().is_cpu()) return *this;
  Tensor copy = empty(shape_, dtype_);
  copy.copy_from(*this);
  return copy;
}

}  // namespace quiver
