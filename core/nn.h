// Modules: the layer-level public API over GraphBuilder, in the spirit of PyTorch's C++ frontend.
// A module creates its named parameters (scoped by the module's name) when it is applied to a
// builder, so the same module code builds a training graph and an evaluation graph of another
// batch size with the same parameter layout. Options structs have chaining setters.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/builder.h"

namespace quiver {

class Module {
 public:
  explicit Module(std::string name) : name_(std::move(name)) {}
  virtual ~Module() = default;
  virtual Value forward(GraphBuilder& builder, Value x) = 0;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// How a Linear or Conv2d layer draws its initial parameters (fan_in = inputs per output).
enum class LayerInit {
  // The default. Weights U(-sqrt(6/fan_in), sqrt(6/fan_in)), biases 0: He et al. (2015) for
  // layers that feed ReLUs. One epoch of the bundled recipe ends 1-3 points higher than with
  // torch_default (docs/benchmarks.md, "Accuracy after one epoch").
  he_uniform,
  // PyTorch's nn.Linear / nn.Conv2d defaults: weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
  // for comparing with a PyTorch model step for step.
  torch_default,
};

struct LinearOptions {
  LinearOptions(int64_t in, int64_t out) : in_features(in), out_features(out) {}
  LinearOptions& bias(bool on) { with_bias = on; return *this; }
  LinearOptions& init(LayerInit value) { init_ = value; return *this; }
  int64_t in_features, out_features;
  bool with_bias = true;
  LayerInit init_ = LayerInit::he_uniform;
};

// x (B, in) -> (B, out); weight (in, out), bias (out), drawn as LinearOptions::init says.
class Linear : public Module {
 public:
  Linear(std::string name, LinearOptions options) : Module(std::move(name)), options_(options) {}
  Value forward(GraphBuilder& builder, Value x) override;

 private:
  LinearOptions options_;
};

struct Conv2dOptions {
  Conv2dOptions(int64_t in, int64_t out, int64_t kernel)
      : in_channels(in), out_channels(out), kernel_size(kernel) {}
  Conv2dOptions& stride(int64_t value) { stride_ = value; return *this; }
  Conv2dOptions& padding(int64_t value) { padding_ = value; return *this; }
  Conv2dOptions& bias(bool on) { with_bias = on; return *this; }
  Conv2dOptions& init(LayerInit value) { init_ = value; return *this; }
  int64_t in_channels, out_channels, kernel_size;
  int64_t stride_ = 1, padding_ = 0;
  bool with_bias = true;
  LayerInit init_ = LayerInit::he_uniform;
};

// x (B, C, H, W) -> (B, O, OH, OW); weight (O, C, K, K), bias (O), fan_in C*K*K, drawn as
// Conv2dOptions::init says.
class Conv2d : public Module {
 public:
  Conv2d(std::string name, Conv2dOptions options) : Module(std::move(name)), options_(options) {}
  Value forward(GraphBuilder& builder, Value x) override;

 private:
  Conv2dOptions options_;
};

class MaxPool2d : public Module {
 public:
  MaxPool2d(std::string name, int64_t kernel, int64_t stride = 0)
      : Module(std::move(name)), kernel_(kernel), stride_(stride) {}
  Value forward(GraphBuilder& builder, Value x) override;

 private:
  int64_t kernel_, stride_;
};

class ReLU : public Module {
 public:
  explicit ReLU(std::string name) : Module(std::move(name)) {}
  Value forward(GraphBuilder& builder, Value x) override;
};

class Flatten : public Module {
 public:
  explicit Flatten(std::string name) : Module(std::move(name)) {}
  Value forward(GraphBuilder& builder, Value x) override;
};

struct LSTMOptions {
  LSTMOptions(int64_t input, int64_t hidden) : input_size(input), hidden_size(hidden) {}
  int64_t input_size, hidden_size;
};

// x (B, T, I) -> every step's hidden state (B, T, H); parameters wx (I, 4H), wh (H, 4H), b (4H),
// gates in the order i, f, g, o, initialised like PyTorch: weights U(-1/sqrt(H), 1/sqrt(H)), the
// bias as the sum of two such draws (PyTorch's b_ih + b_hh).
class LSTM : public Module {
 public:
  LSTM(std::string name, LSTMOptions options) : Module(std::move(name)), options_(options) {}
  Value forward(GraphBuilder& builder, Value x) override;

 private:
  LSTMOptions options_;
};

// (B, T, H) -> (B, H): the last time step.
class LastStep : public Module {
 public:
  explicit LastStep(std::string name) : Module(std::move(name)) {}
  Value forward(GraphBuilder& builder, Value x) override;
};

class Sequential : public Module {
 public:
  explicit Sequential(std::string name = "") : Module(std::move(name)) {}
  template <typename M, typename... Args>
  Sequential& add(Args&&... args) {
    layers_.push_back(std::make_shared<M>(std::forward<Args>(args)...));
    return *this;
  }
  Value forward(GraphBuilder& builder, Value x) override;

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

// A model as the trainer and benchmarks see it: what one sample looks like, and how to build the
// logits (B, classes) from a batch of samples (B, sample_shape...).
struct ModelSpec {
  std::string name;
  Shape sample_shape;
  std::function<Value(GraphBuilder&, Value)> build;
};

}  // namespace quiver
