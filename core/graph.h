// The static dataflow graph: SSA values with shapes known at build time, nodes naming an op kind,
// and the parameters the graph reads. Forward, backward and optimizer-update nodes all live in
// one Graph; nodes are appended in dependency order, so node id order is a valid schedule.
// A Graph says what to compute, not where it lives or how it runs: that is runtime::Plan.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "core/shape.h"

namespace quiver {

using ValueId = int;
using NodeId = int;

// A handle the builder API passes around: a value's id in its graph. Handles a GraphBuilder makes
// (and Graph::handle) carry their graph's serial, so a handle from another graph is refused with
// an error rather than taken as whichever value has its id there. A copy of a graph gets a serial
// of its own and still takes its original's handles to the values it was copied with (a Plan's
// copy takes the builder's handles), but not to values either adds afterwards. Value(id) carries
// none (0) and is taken at its word.
struct Value {
  ValueId id = -1;
  uint64_t graph = 0;
  Value() = default;
  explicit Value(ValueId id, uint64_t graph = 0) : id(id), graph(graph) {}
  bool valid() const { return id >= 0; }
};

enum class ValueRole {
  Activation,  // produced by a node; its memory is planned and reused
  Input,       // fed by the caller each step (a batch, labels, the learning rate)
  Parameter,   // a view of the replica's flat parameter buffer
  ParamGrad,   // the accumulated gradient of a parameter: a view of the flat gradient buffer
  State,       // optimizer state (momentum, Adam moments): a view of a flat state buffer
};

struct ValueInfo {
  ValueId id = -1;
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
  ValueRole role = ValueRole::Activation;
  NodeId producer = -1;     // -1 for inputs, parameters and state
  int param_index = -1;     // Parameter, ParamGrad and State: which parameter
  std::string state_kind;   // State: "velocity", "adam_m", ...
};

using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::string>;

class Attrs {
 public:
  Attrs& set(const std::string& key, AttrValue value);
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  const std::vector<int64_t>& get_ints(const std::string& key) const;
  std::string str() const;  // "padding=1,stride=2" (keys in order): for op keys and messages
  const std::map<std::string, AttrValue>& all() const { return values_; }

 private:
  std::map<std::string, AttrValue> values_;
};

struct Node {
  NodeId id = -1;
  std::string op;
  std::string name;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::vector<NodeId> control_inputs;  // run after these (an in-place update after all readers)
  Attrs attrs;
};

enum class InitKind { Zeros, Uniform };

struct ParamInit {
  InitKind kind = InitKind::Zeros;
  double bound = 0.0;  // Uniform: the sum of `terms` draws of U(-bound, bound)
  int terms = 1;
  static ParamInit zeros() { return {}; }
  static ParamInit uniform(double bound, int terms = 1) { return {InitKind::Uniform, bound, terms}; }
  // PyTorch's defaults for Linear/Conv weights and biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  static ParamInit fan_in_uniform(int64_t fan_in);
  // He/Kaiming uniform for layers that feed ReLUs (gain sqrt(2), fan-in mode):
  // U(-sqrt(6/fan_in), sqrt(6/fan_in)), which keeps the activations' variance through the layers.
  static ParamInit he_uniform(int64_t fan_in);
  // Glorot/Xavier uniform: U(-sqrt(6/(fan_in+fan_out)), +...).
  static ParamInit glorot_uniform(int64_t fan_in, int64_t fan_out);
};

struct ParamInfo {
  std::string name;
  ValueId value = -1;
  ValueId grad = -1;  // set by autodiff
  ParamInit init;
};

class Graph {
 public:
  Graph();  // a new serial
  // A copy has a new serial; the original's handles to the values copied work on it (id_of).
  Graph(const Graph& other);
  Graph& operator=(const Graph& other);
  // The same graph, moved: its handles keep working here; the moved-from graph, should it be
  // built on again, is a new one (a serial of its own).
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;

  // Lookups by id; an id that does not exist throws quiver::Error.
  const ValueInfo& value(ValueId id) const;
  ValueInfo& value(ValueId id);
  const Node& node(NodeId id) const;  // read-only: a node's edges are fixed once it is added
  const std::vector<ValueInfo>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  std::vector<ParamInfo>& params() { return params_; }

  ValueId add_value(ValueInfo info);
  NodeId add_node(Node node);  // inputs must already exist; sets producers of its outputs
  int add_param(ParamInfo info);

  // Nodes reading `value`, in id order. Valid until the next add_value or add_node: copy it to add
  // nodes while going through it.
  const std::vector<NodeId>& consumers(ValueId value) const;
  // The value named `name` (inputs and parameters are looked up this way); throws if absent.
  ValueId find(const std::string& name) const;
  bool has_name(const std::string& name) const;

  uint64_t serial() const { return serial_; }
  Value handle(ValueId id) const;  // the handle of an existing value, carrying this graph's serial
  // The id of `value`, after checking that it names a value of this graph, or one this graph was
  // copied with (a handle of the graph it is a copy of, made before the copy); otherwise throws
  // quiver::Error starting with `what`.
  ValueId id_of(Value value, const std::string& what) const;

 private:
  // What this graph is a copy of: each original's serial and how many values it had then (its
  // own originals first).
  struct Origin {
    uint64_t serial;
    ValueId values;
  };
  uint64_t serial_;
  std::vector<Origin> origins_;
  std::vector<ValueInfo> values_;
  std::vector<Node> nodes_;
  std::vector<ParamInfo> params_;
  std::vector<std::vector<NodeId>> readers_;  // readers_[v]: the nodes reading value v, in id order
};

}  // namespace quiver
