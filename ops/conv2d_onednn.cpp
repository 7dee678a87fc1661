// oneDNN convolution kernels for conv2d, conv2d_grad_input and conv2d_grad_weight.
// oneDNN's direct JIT convolutions want blocked layouts (nChw16c and the like); Quiver keeps
// activations in plain NCHW, so each call reorders into the primitive's layout and back. Measured
// on the bundled CNN's shapes that still runs 3-4x faster than im2col + GEMM (docs/benchmarks.md).
// Threads: the batch is cut into at most ctx.threads() slices, each run single-threaded by one
// granted thread with its own primitive, stream and buffers, so oneDNN's OpenMP runtime never
// opens a parallel region. Primitives are created on first use for a slice count, never per step
// (the whole batch as one slice, and as many slices as the plan has threads, when the kernel is
// prepared). Every buffer a slice needs is a region of one of three buffers shared by every slice
// count: the reordered copies of the two arguments cut by the batch, one buffer each, and the
// slice's own (its copy of the argument not cut, its share of dw, its scratchpad) in the third.
// The slices of one count run at once and take consecutive regions, and two slice counts never
// run at once (a node runs one call at a time), so the kernel holds what its widest count needs,
// which preparing it counts. Each count owning its copies cost the CNN at batch 2000 1.35 GB
// instead of 0.92 on two threads, where auto profiles counts 1 and 2; a many-core host profiles a
// dozen counts, and its slices' own weight copies added up to hundreds of MB the plan never counted.
// Every primitive (convolutions and reorders) has its own scratchpad (scratchpad_mode::user): in
// oneDNN's default library mode the scratchpad is shared by the primitives a thread created,
// and such a primitive must run on that thread; here they are created on the calling thread and
// run on whichever granted thread takes their slice, two of them at once.

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "core/error.h"
#include "ops/conv2d.h"
#include "ops/onednn_threads.h"
#include "ops/kernel_util.h"

namespace quiver {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

dnnl::primitive_attr own_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// A reorder between two memories, with the scratchpad it asks for.
struct Reorder {
  Reorder() = default;
  Reorder(const memory& from, const memory& to, const dnnl::engine& engine) {
    dnnl::reorder::primitive_desc pd(from, to, own_scratchpad());
    primitive = dnnl::reorder(pd);
    scratchpad = memory(pd.scratchpad_desc(), engine);
  }
  void run(dnnl::stream& stream, const memory& from, const memory& to) {
    primitive.execute(stream, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}, {DNNL_ARG_SCRATCHPAD, scratchpad}});
  }
  dnnl::reorder primitive;
  memory scratchpad;
};

// One argument: Quiver's plain-layout view (its data pointer set per call) and the layout the
// primitive wants, with the reorders between them created once.
// With `shared_internal` the reordered copy has no buffer of its own: bind_internal() points it
// into a SharedBuffer before each call.
class Staged {
 public:
  Staged(const memory::desc& plain, const memory::desc& wanted, const dnnl::engine& engine,
         bool shared_internal = false)
      : user_(plain, engine, DNNL_MEMORY_NONE), reordered_(plain != wanted) {
    internal_ = !reordered_ ? user_ : shared_internal ? memory(wanted, engine, DNNL_MEMORY_NONE) : memory(wanted, engine);
    if (reordered_) into_ = Reorder(user_, internal_, engine), back_ = Reorder(internal_, user_, engine);
  }
  void bind(const float* data) { user_.set_data_handle(const_cast<float*>(data)); }
  // Rebinding only when the buffer moved: oneDNN zero-pads a padded layout on every bind.
  void bind_internal(char* data) {
    if (!reordered_ || data == bound_) return;  // not reordered: internal_ is user_ itself
    internal_.set_data_handle(data);
    bound_ = data;
  }
  // Bytes of the reordered copy (0 when the primitive takes Quiver's layout as it is).
  size_t internal_bytes() const { return reordered_ ? internal_.get_desc().get_size() : 0; }
  void to_internal(dnnl::stream& stream) {
    if (reordered_) into_.run(stream, user_, internal_);
  }
  void to_user(dnnl::stream& stream) {
    if (reordered_) back_.run(stream, internal_, user_);
  }
  const memory& internal() const { return internal_; }

 private:
  memory user_, internal_;
  bool reordered_;
  char* bound_ = nullptr;  // what internal_ points into, with shared_internal
  Reorder into_, back_;
};

enum class Pass { Forward, BackwardData, BackwardWeights };

// Bytes shared by the slices of every count, each slice taking a region. Its contents never
// outlive a call: each call fills what it reads.
class SharedBuffer {
 public:
  static size_t rounded(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    const size_t size = rounded(bytes);
    std::unique_ptr<char, Free> grown(static_cast<char*>(std::aligned_alloc(kAlign, size)));
    if (!grown) throw Error(cat("oneDNN convolution: out of memory allocating ", size, " bytes"));
    data_ = std::move(grown);  // the old buffer stays until the new one exists
    bytes_ = size;
  }
  char* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }
  static constexpr size_t kAlign = 64;

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> data_;
  size_t bytes_ = 0;
};

// A slice of the batch: images [first, first + count), with its primitive and staged arguments.
struct Slice {
  int64_t first = 0, count = 0;
  dnnl::stream stream;
  dnnl::primitive primitive;
  std::unique_ptr<Staged> lhs, rhs, out;  // two inputs and the output, in the pass's argument order
  int lhs_arg = 0, rhs_arg = 0, out_arg = 0;
  memory scratchpad;            // the primitive's own (see the top of this file), in the own region
  int64_t partial_weights = 0;  // BackwardWeights: floats of this slice's share of dw, in the own region
  // The two arguments cut by the batch (Forward: x, y; BackwardData: dy, dx; BackwardWeights: dy,
  // x), whose reordered copies live in the kernel's first two shared buffers, and the one not cut
  // (the weights, or dw), whose copy starts the slice's own region in the third.
  std::array<Staged*, 2> sliced{};
  Staged* whole = nullptr;
  std::array<size_t, 3> offset{};  // in each shared buffer
  char* scratchpad_bound = nullptr;

  // The own region holds whole's copy, dw's share and the scratchpad, in that order.
  size_t whole_bytes() const { return SharedBuffer::rounded(whole->internal_bytes()); }
  size_t partial_bytes() const { return SharedBuffer::rounded(static_cast<size_t>(partial_weights) * sizeof(float)); }
  // Bytes the slice takes in each shared buffer.
  std::array<size_t, 3> bytes() const {
    return {SharedBuffer::rounded(sliced[0]->internal_bytes()), SharedBuffer::rounded(sliced[1]->internal_bytes()),
            whole_bytes() + partial_bytes() + SharedBuffer::rounded(scratchpad.get_desc().get_size())};
  }
  float* partial(const std::array<SharedBuffer, 3>& shared) const {
    return reinterpret_cast<float*>(shared[2].data() + offset[2] + whole_bytes());
  }
  // Points the copies and the scratchpad at the slice's regions (rebinding only what moved).
  void bind(const std::array<SharedBuffer, 3>& shared) {
    for (size_t k = 0; k < sliced.size(); ++k) sliced[k]->bind_internal(shared[k].data() + offset[k]);
    whole->bind_internal(shared[2].data() + offset[2]);
    char* pad = shared[2].data() + offset[2] + whole_bytes() + partial_bytes();
    if (scratchpad.get_desc().get_size() > 0 && pad != scratchpad_bound) {
      scratchpad.set_data_handle(pad);
      scratchpad_bound = pad;
    }
  }
};

memory::desc plain(const memory::dims& dims, Tag tag) { return memory::desc(dims, memory::data_type::f32, tag); }
memory::desc any(const memory::dims& dims) { return memory::desc(dims, memory::data_type::f32, Tag::any); }

std::unique_ptr<Slice> make_slice(Pass pass, const ConvGeometry& g, int64_t first, int64_t count,
                                  const dnnl::engine& engine) {
  auto slice = std::make_unique<Slice>();
  slice->first = first;
  slice->count = count;
  slice->stream = dnnl::stream(engine);
  memory::dims src{count, g.channels, g.height, g.width}, weights{g.out_channels, g.channels, g.kernel_h, g.kernel_w};
  memory::dims dst{count, g.out_channels, g.out_h, g.out_w}, strides{g.stride, g.stride}, padding{g.padding, g.padding};
  dnnl::convolution_forward::desc forward(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                          any(src), any(weights), any(dst), strides, padding, padding);
  const dnnl::primitive_attr attr = own_scratchpad();
  dnnl::convolution_forward::primitive_desc forward_pd(forward, attr, engine);
  if (pass == Pass::Forward) {
    slice->primitive = dnnl::convolution_forward(forward_pd);
    slice->scratchpad = memory(forward_pd.scratchpad_desc(), engine, DNNL_MEMORY_NONE);
    slice->lhs = std::make_unique<Staged>(plain(src, Tag::nchw), forward_pd.src_desc(), engine, true);
    slice->rhs = std::make_unique<Staged>(plain(weights, Tag::oihw), forward_pd.weights_desc(), engine, true);
    slice->out = std::make_unique<Staged>(plain(dst, Tag::nchw), forward_pd.dst_desc(), engine, true);
    slice->lhs_arg = DNNL_ARG_SRC, slice->rhs_arg = DNNL_ARG_WEIGHTS, slice->out_arg = DNNL_ARG_DST;
    slice->sliced = {slice->lhs.get(), slice->out.get()};
    slice->whole = slice->rhs.get();
  } else if (pass == Pass::BackwardData) {
    dnnl::convolution_backward_data::desc desc(dnnl::algorithm::convolution_direct, any(src), any(weights),
                                               any(dst), strides, padding, padding);
    dnnl::convolution_backward_data::primitive_desc pd(desc, attr, engine, forward_pd);
    slice->primitive = dnnl::convolution_backward_data(pd);
    slice->scratchpad = memory(pd.scratchpad_desc(), engine, DNNL_MEMORY_NONE);
    slice->lhs = std::make_unique<Staged>(plain(dst, Tag::nchw), pd.diff_dst_desc(), engine, true);
    slice->rhs = std::make_unique<Staged>(plain(weights, Tag::oihw), pd.weights_desc(), engine, true);
    slice->out = std::make_unique<Staged>(plain(src, Tag::nchw), pd.diff_src_desc(), engine, true);
    slice->lhs_arg = DNNL_ARG_DIFF_DST, slice->rhs_arg = DNNL_ARG_WEIGHTS, slice->out_arg = DNNL_ARG_DIFF_SRC;
    slice->sliced = {slice->lhs.get(), slice->out.get()};
    slice->whole = slice->rhs.get();
  } else {
    dnnl::convolution_backward_weights::desc desc(dnnl::algorithm::convolution_direct, any(src), any(weights),
                                                  any(dst), strides, padding, padding);
    dnnl::convolution_backward_weights::primitive_desc pd(desc, attr, engine, forward_pd);
    slice->primitive = dnnl::convolution_backward_weights(pd);
    slice->scratchpad = memory(pd.scratchpad_desc(), engine, DNNL_MEMORY_NONE);
    slice->lhs = std::make_unique<Staged>(plain(dst, Tag::nchw), pd.diff_dst_desc(), engine, true);
    slice->rhs = std::make_unique<Staged>(plain(src, Tag::nchw), pd.src_desc(), engine, true);
    slice->out = std::make_unique<Staged>(plain(weights, Tag::oihw), pd.diff_weights_desc(), engine, true);
    slice->lhs_arg = DNNL_ARG_DIFF_DST, slice->rhs_arg = DNNL_ARG_SRC, slice->out_arg = DNNL_ARG_DIFF_WEIGHTS;
    slice->sliced = {slice->lhs.get(), slice->rhs.get()};
    slice->whole = slice->out.get();
    slice->partial_weights = g.out_channels * g.patch();
  }
  return slice;
}

class OnednnConv {
 public:
  OnednnConv(Pass pass, ConvGeometry g) : pass_(pass), g_(g), engine_(dnnl::engine::kind::cpu, 0) {}

  // inputs: Forward (x, w) -> y; BackwardData (dy, w) -> dx; BackwardWeights (dy, x) -> dw.
  void run(const KernelCall& call) {
    const OneDnnOnThisThread one_thread;  // primitives made below take their thread count from this thread
    std::vector<std::unique_ptr<Slice>>& slices = slices_for(std::min<int64_t>(call.ctx.threads(), g_.batch));
    const int64_t image_in = g_.channels * g_.height * g_.width, image_out = g_.out_channels * g_.out_plane();
    const float* lhs = call.inputs[0].f32();
    const float* rhs = call.inputs[1].f32();
    float* out = call.outputs[0].f32();
    call.ctx.parallel_for(static_cast<int64_t>(slices.size()), 1, [&](int64_t begin, int64_t end) {
      const OneDnnOnThisThread one_thread_here;
      for (int64_t index = begin; index < end; ++index) {
        Slice& s = *slices[index];
        switch (pass_) {
          case Pass::Forward:
            s.lhs->bind(lhs + s.first * image_in), s.rhs->bind(rhs), s.out->bind(out + s.first * image_out);
            break;
          case Pass::BackwardData:
            s.lhs->bind(lhs + s.first * image_out), s.rhs->bind(rhs), s.out->bind(out + s.first * image_in);
            break;
          case Pass::BackwardWeights:
            s.lhs->bind(lhs + s.first * image_out), s.rhs->bind(rhs + s.first * image_in);
            s.out->bind(s.partial(shared_));
            break;
        }
        s.bind(shared_);
        s.lhs->to_internal(s.stream);
        s.rhs->to_internal(s.stream);
        s.primitive.execute(s.stream, {{s.lhs_arg, s.lhs->internal()}, {s.rhs_arg, s.rhs->internal()},
                                       {s.out_arg, s.out->internal()}, {DNNL_ARG_SCRATCHPAD, s.scratchpad}});
        s.out->to_user(s.stream);
        s.stream.wait();
      }
    });
    if (pass_ != Pass::BackwardWeights) return;
    const int64_t weights = g_.out_channels * g_.patch();
    std::copy_n(slices[0]->partial(shared_), weights, out);
    for (size_t index = 1; index < slices.size(); ++index) {
      const float* partial = slices[index]->partial(shared_);
      for (int64_t i = 0; i < weights; ++i) out[i] += partial[i];
    }
  }

  // The slices for `count` threads, made on first use; their buffers take consecutive regions of
  // the shared buffers, grown to fit.
  std::vector<std::unique_ptr<Slice>>& slices_for(int64_t count) {
    auto found = slices_.find(count);
    if (found != slices_.end()) return found->second;
    std::vector<std::unique_ptr<Slice>> made;
    std::array<size_t, 3> used{};
    for (int64_t index = 0; index < count; ++index) {
      int64_t first = g_.batch * index / count, last = g_.batch * (index + 1) / count;
      made.push_back(make_slice(pass_, g_, first, last - first, engine_));
      Slice& slice = *made.back();
      const std::array<size_t, 3> bytes = slice.bytes();
      for (size_t k = 0; k < used.size(); ++k) {
        slice.offset[k] = used[k];
        used[k] += bytes[k];
      }
    }
    for (size_t k = 0; k < used.size(); ++k) shared_[k].reserve(used[k]);  // may throw: nothing kept yet
    return slices_.emplace(count, std::move(made)).first->second;
  }

  // Bytes held for the kernel's own use so far: the shared buffers (each slice's reorders keep a
  // scratchpad of their own too, where one asks for it: none of the bundled shapes' does).
  int64_t scratch_bytes() const {
    return static_cast<int64_t>(shared_[0].bytes() + shared_[1].bytes() + shared_[2].bytes());
  }

 private:
  Pass pass_;
  ConvGeometry g_;
  dnnl::engine engine_;
  std::map<int64_t, std::vector<std::unique_ptr<Slice>>> slices_;  // by slice count
  std::array<SharedBuffer, 3> shared_;  // Slice::sliced's reordered copies, by position; the slices' own
};

KernelImpl make_kernel(Pass pass) {
  KernelImpl impl;
  impl.name = "onednn";
  impl.device = DeviceKind::CPU;
  impl.prepare = [pass](const KernelSpec& spec) -> KernelFn {
    const Shape& x = pass == Pass::Forward ? spec.input(0).shape
                     : pass == Pass::BackwardData ? spec.output(0).shape : spec.input(1).shape;
    const Shape& w = pass == Pass::BackwardWeights ? spec.output(0).shape : spec.input(1).shape;
    ConvGeometry g = conv_geometry(x, w, spec.node.attrs.get_int("stride", 1), spec.node.attrs.get_int("padding", 0));
    auto conv = std::make_shared<OnednnConv>(pass, g);
    // The whole batch as one slice now, and as many slices as the plan has threads, so the plan's
    // footprint counts the shared buffers as the widest count grows them (the batch-cut copies
    // hold the same images at every count; the own regions grow with the count).
    try {
      const OneDnnOnThisThread one_thread;
      conv->slices_for(1);
      if (spec.context) conv->slices_for(std::clamp<int64_t>(spec.context->threads(), 1, g.batch));
    } catch (const dnnl::error& error) {
      throw Error(cat(spec.node.op, " '", spec.node.name, "': oneDNN error ", static_cast<int>(error.status), ": ",
                      error.what()));
    }
    spec.scratch_bytes += conv->scratch_bytes();
    return [conv](const KernelCall& call) {
      try {
        conv->run(call);
      } catch (const dnnl::error& error) {
        throw Error(cat(call.node.op, " '", call.node.name, "': oneDNN error ", static_cast<int>(error.status), ": ",
                        error.what()));
      }
    };
  };
  return impl;
}

}  // namespace

KernelImpl onednn_conv2d_kernel() { return make_kernel(Pass::Forward); }
KernelImpl onednn_conv2d_grad_input_kernel() { return make_kernel(Pass::BackwardData); }
KernelImpl onednn_conv2d_grad_weight_kernel() { return make_kernel(Pass::BackwardWeights); }

}  // namespace quiver
