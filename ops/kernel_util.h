// Small helpers shared by the op files: registering a stateless kernel, checking shapes during
// inference, and (through ops/host_device.h) the per-element math annotation that lets the CUDA
// build reuse the same functions.
#pragma once

#include <string>
#include <utility>

#include "core/error.h"
#include "core/op.h"
#include "ops/host_device.h"

namespace quiver {

// A kernel with no per-Plan state: `prepare` just hands back `fn`.
inline KernelImpl cpu_kernel(std::string name, KernelFn fn) {
  KernelImpl impl;
  impl.name = std::move(name);
  impl.device = DeviceKind::CPU;
  impl.prepare = [fn = std::move(fn)](const KernelSpec&) { return fn; };
  return impl;
}

// Elementwise work is split in chunks of this many elements: large enough that scheduling a chunk
// costs little next to computing it.
constexpr int64_t kElementwiseGrain = 16384;

inline void expect_rank(const InferContext& ctx, int input, int rank) {
  if (ctx.shape(input).rank() != rank)
    ctx.fail(cat("input ", input, " must have rank ", rank, ", got ", ctx.shape(input).str()));
}

inline void expect_dtype(const InferContext& ctx, int input, DType dtype) {
  if (ctx.inputs.at(input).dtype != dtype)
    ctx.fail(cat("input ", input, " must be ", name_of(dtype), ", got ",
                 name_of(ctx.inputs.at(input).dtype)));
}

inline void expect_inputs(const InferContext& ctx, size_t count) {
  if (ctx.inputs.size() != count)
    ctx.fail(cat("expects ", count, " inputs, got ", ctx.inputs.size()));
}

}  // namespace quiver
