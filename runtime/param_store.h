// ParamStore: one replica's parameters, gradients and optimizer state, each a single flat
// allocation with a view per parameter. Zeroing, averaging, checkpointing and all-reduce are then
// one pass over one buffer. The layout comes from a graph's parameter list; graphs built by the
// same model code (a training graph and an evaluation graph of another batch size) share it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/graph.h"
#include "core/tensor.h"

namespace quiver {

struct ParamSlot {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // elements into the flat buffers, 16-float aligned
  ParamInit init;
};

class ParamStore {
 public:
  // The flat buffers live on `device` (initialised on the host, then copied there).
  explicit ParamStore(const Graph& graph, Device device = Device::cpu());
  // Not copyable: a copy would share the buffers (an alias, not a snapshot) but not optimizer
  // state created later. Copy flat_params() into a tensor of its own to keep a snapshot.
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;
  ParamStore(ParamStore&&) = default;
  ParamStore& operator=(ParamStore&&) = default;
  Device device() const { return device_; }

  // Seeded initialisation: each parameter's values depend only on (seed, its name).
  void initialize(uint64_t seed);
  // Throws unless `graph` declares exactly this store's parameters (names and shapes, in order).
  void check_compatible(const Graph& graph) const;

  const std::vector<ParamSlot>& slots() const { return slots_; }
  int64_t flat_size() const { return flat_size_; }
  const Tensor& flat_params() const { return params_; }
  const Tensor& flat_grads() const { return grads_; }
  // The flat buffer of one kind of optimizer state ("velocity"), zero-initialised on first use.
  const Tensor& flat_state(const std::string& kind);
  // The kinds of optimizer state created so far ("velocity"; "adam_m", ...).
  std::vector<std::string> state_kinds() const;

  Tensor param(int index) const { return view(params_, index); }
  Tensor grad(int index) const { return view(grads_, index); }
  Tensor state(const std::string& kind, int index) { return view(flat_state(kind), index); }

 private:
  Tensor view(const Tensor& flat, int index) const;
  std::vector<ParamSlot> slots_;
  Device device_;
  int64_t flat_size_ = 0;
  Tensor params_, grads_;
  std::map<std::string, Tensor> states_;
};

}  // namespace quiver
