#include "runtime/param_store.h"

#include <random>

#include "core/error.h"

namespace quiver {

namespace {

constexpr int64_t kSlotAlignment = 16;  // floats: 64 bytes

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// Uniform in [0, 1) from 53 random bits: the same on every standard library.
double unit_uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

ParamStore::ParamStore(const Graph& graph, Device device) : device_(device) {
  for (const ParamInfo& param : graph.params()) {
    ParamSlot slot{param.name, graph.value(param.value).shape, flat_size_, param.init};
    const int64_t padded = (slot.shape.numel() + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
    if (__builtin_add_overflow(flat_size_, padded, &flat_size_))
      throw Error(cat("parameters up to '", param.name, "': more elements than int64 holds"));
    slots_.push_back(std::move(slot));
  }
  params_ = Tensor::zeros(Shape{flat_size_}, DType::F32, device);
  grads_ = Tensor::zeros(Shape{flat_size_}, DType::F32, device);
}

void ParamStore::initialize(uint64_t seed) {
  Tensor host = device_.is_cpu() ? params_ : Tensor::zeros(Shape{flat_size_});
  for (size_t index = 0; index < slots_.size(); ++index) {
    const ParamSlot& slot = slots_[index];
    float* values = view(host, static_cast<int>(index)).f32();
    std::mt19937_64 rng(seed ^ fnv1a(slot.name));
    for (int64_t i = 0; i < slot.shape.numel(); ++i) {
      double value = 0.0;
      if (slot.init.kind == InitKind::Uniform)
        for (int term = 0; term < slot.init.terms; ++term)
          value += (2.0 * unit_uniform(rng) - 1.0) * slot.init.bound;
      values[i] = static_cast<float>(value);
    }
  }
  if (!device_.is_cpu()) params_.copy_from(host);
  for (auto& [kind, state] : states_) state.fill(0.0f);
}

void ParamStore::check_compatible(const Graph& graph) const {
  const auto& params = graph.params();
  if (params.size() != slots_.size())
    throw Error(cat("graph has ", params.size(), " parameters but the store holds ", slots_.size()));
  for (size_t i = 0; i < params.size(); ++i) {
    const Shape& shape = graph.value(params[i].value).shape;
    if (params[i].name != slots_[i].name || shape != slots_[i].shape)
      throw Error(cat("parameter ", i, " is '", params[i].name, "' ", shape.str(), " in the graph but '",
                      slots_[i].name, "' ", slots_[i].shape.str(), " in the store"));
  }
}

const Tensor& ParamStore::flat_state(const std::string& kind) {
  auto found = states_.find(kind);
  if (found == states_.end()) found = states_.emplace(kind, Tensor::zeros(Shape{flat_size_}, DType::F32, device_)).first;
  return found->second;
}

std::vector<std::string> ParamStore::state_kinds() const {
  std::vector<std::string> kinds;
  for (const auto& [kind, state] : states_) kinds.push_back(kind);
  return kinds;
}

Tensor ParamStore::view(const Tensor& flat, int index) const {
  if (index < 0 || index >= static_cast<int>(slots_.size()))
    throw Error(cat("no parameter ", index, " in this store (it has ", slots_.size(), ")"));
  const ParamSlot& slot = slots_[static_cast<size_t>(index)];
  return flat.slice(slot.offset, slot.shape);
}

}  // namespace quiver
