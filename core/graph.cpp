#include "core/graph.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "core/error.h"

namespace quiver {

namespace {
// What an attribute holds, for the message when it is read as another type.
const char* kind_of(const AttrValue& value) {
  switch (value.index()) {
    case 0: return "an integer";
    case 1: return "a float";
    case 2: return "a list of integers";
    default: return "a string";
  }
}
}  // namespace

Attrs& Attrs::set(const std::string& key, AttrValue value) {
  values_[key] = std::move(value);
  return *this;
}

int64_t Attrs::get_int(const std::string& key) const {
  auto found = values_.find(key);
  if (found == values_.end()) throw Error(cat("missing integer attribute '", key, "'"));
  if (!std::holds_alternative<int64_t>(found->second))
    throw Error(cat("attribute '", key, "' is ", kind_of(found->second), ", not an integer"));
  return std::get<int64_t>(found->second);
}

int64_t Attrs::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double Attrs::get_float(const std::string& key) const {
  auto found = values_.find(key);
  if (found == values_.end()) throw Error(cat("missing float attribute '", key, "'"));
  if (std::holds_alternative<int64_t>(found->second))
    return static_cast<double>(std::get<int64_t>(found->second));
  if (!std::holds_alternative<double>(found->second))
    throw Error(cat("attribute '", key, "' is ", kind_of(found->second), ", not a number"));
  return std::get<double>(found->second);
}

double Attrs::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

const std::vector<int64_t>& Attrs::get_ints(const std::string& key) const {
  auto found = values_.find(key);
  if (found == values_.end()) throw Error(cat("missing integer-list attribute '", key, "'"));
  if (!std::holds_alternative<std::vector<int64_t>>(found->second))
    throw Error(cat("attribute '", key, "' is ", kind_of(found->second), ", not a list of integers"));
  return std::get<std::vector<int64_t>>(found->second);
}

std::string Attrs::str() const {
  std::string text;
  for (const auto& [key, value] : values_) {
    if (!text.empty()) text += ",";
    text += key + "=";
    if (auto* integer = std::get_if<int64_t>(&value)) text += std::to_string(*integer);
    if (auto* real = std::get_if<double>(&value)) text += cat(*real);
    if (auto* text_value = std::get_if<std::string>(&value)) text += *text_value;
    if (auto* list = std::get_if<std::vector<int64_t>>(&value)) text += Shape(*list).str();
  }
  return text;
}

ParamInit ParamInit::fan_in_uniform(int64_t fan_in) {
  return uniform(1.0 / std::sqrt(static_cast<double>(fan_in)));
}

ParamInit ParamInit::he_uniform(int64_t fan_in) {
  return uniform(std::sqrt(6.0 / static_cast<double>(fan_in)));
}

ParamInit ParamInit::glorot_uniform(int64_t fan_in, int64_t fan_out) {
  return uniform(std::sqrt(6.0 / (static_cast<double>(fan_in) + static_cast<double>(fan_out))));
}

namespace {
std::atomic<uint64_t> graphs_made{0};
}

Graph::Graph() : serial_(++graphs_made) {}

Graph::Graph(const Graph& other)
    : serial_(++graphs_made),
      origins_(other.origins_),
      values_(other.values_),
      nodes_(other.nodes_),
      params_(other.params_),
      readers_(other.readers_) {
  origins_.push_back({other.serial_, static_cast<ValueId>(other.values_.size())});
}

Graph::Graph(Graph&& other) noexcept
    : serial_(std::exchange(other.serial_, ++graphs_made)),
      origins_(std::move(other.origins_)),
      values_(std::move(other.values_)),
      nodes_(std::move(other.nodes_)),
      params_(std::move(other.params_)),
      readers_(std::move(other.readers_)) {
  other.origins_.clear(), other.values_.clear(), other.nodes_.clear(), other.params_.clear(), other.readers_.clear();
}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this == &other) return *this;
  serial_ = std::exchange(other.serial_, ++graphs_made);
  origins_ = std::move(other.origins_);
  values_ = std::move(other.values_);
  nodes_ = std::move(other.nodes_);
  params_ = std::move(other.params_);
  readers_ = std::move(other.readers_);
  other.origins_.clear(), other.values_.clear(), other.nodes_.clear(), other.params_.clear(), other.readers_.clear();
  return *this;
}

Graph& Graph::operator=(const Graph& other) {
  if (this != &other) *this = Graph(other);  // a copy, moved in: a new serial
  return *this;
}

const ValueInfo& Graph::value(ValueId id) const {
  if (id < 0 || id >= static_cast<ValueId>(values_.size()))
    throw Error(cat("no value ", id, " in this graph (it has ", values_.size(), ")"));
  return values_[static_cast<size_t>(id)];
}

ValueInfo& Graph::value(ValueId id) { return const_cast<ValueInfo&>(std::as_const(*this).value(id)); }

const Node& Graph::node(NodeId id) const {
  if (id < 0 || id >= static_cast<NodeId>(nodes_.size()))
    throw Error(cat("no node ", id, " in this graph (it has ", nodes_.size(), ")"));
  return nodes_[static_cast<size_t>(id)];
}

Value Graph::handle(ValueId id) const {
  value(id);  // exists
  return Value(id, serial_);
}

ValueId Graph::id_of(Value handle, const std::string& what) const {
  if (!handle.valid()) throw Error(cat(what, ": the value is empty (a default Value)"));
  if (handle.graph != 0 && handle.graph != serial_) {
    const auto origin = std::find_if(origins_.begin(), origins_.end(),
                                     [&](const Origin& o) { return o.serial == handle.graph; });
    if (origin == origins_.end())
      throw Error(cat(what, ": the value belongs to another graph (one GraphBuilder's values work in its graph only)"));
    if (handle.id >= origin->values)  // added to the original after this copy was made
      throw Error(cat(what, ": the value was added to the graph this one is a copy of after the copy was made "
                            "(a copy takes the values it was made with, not later ones)"));
  }
  if (handle.id >= static_cast<ValueId>(values_.size()))
    throw Error(cat(what, ": no value ", handle.id, " in this graph (it has ", values_.size(), ")"));
  return handle.id;
}

ValueId Graph::add_value(ValueInfo info) {
  info.id = static_cast<ValueId>(values_.size());
  info.producer = -1;  // only add_node makes a value some node's output
  values_.push_back(std::move(info));
  readers_.emplace_back();
  return values_.back().id;
}

NodeId Graph::add_node(Node node) {
  node.id = static_cast<NodeId>(nodes_.size());
  for (ValueId input : node.inputs)
    if (input < 0 || input >= static_cast<ValueId>(values_.size()))
      throw Error(cat(node.op, " '", node.name, "': input value ", input, " does not exist"));
  for (NodeId control : node.control_inputs)
    if (control < 0 || control >= node.id)
      throw Error(cat(node.op, " '", node.name, "': control input ", control, " does not exist"));
  // An output is a new activation: not a parameter or an input, not another node's output, and
  // read by no node yet (that node would run before it is written: a cycle).
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    const ValueId output = node.outputs[i];
    if (output < 0 || output >= static_cast<ValueId>(values_.size()))
      throw Error(cat(node.op, " '", node.name, "': output value ", output, " does not exist"));
    const ValueInfo& info = values_[static_cast<size_t>(output)];
    if (info.role != ValueRole::Activation || info.producer >= 0)
      throw Error(cat(node.op, " '", node.name, "': output '", info.name, "' is ",
                      info.producer >= 0 ? cat("already the output of node ", info.producer) : std::string("not an activation")));
    if (!readers_[static_cast<size_t>(output)].empty())
      throw Error(cat(node.op, " '", node.name, "': output '", info.name, "' is read by an earlier node (a cycle)"));
    if (std::find(node.inputs.begin(), node.inputs.end(), output) != node.inputs.end())
      throw Error(cat(node.op, " '", node.name, "': output '", info.name, "' is also its input (a cycle)"));
    if (std::find(node.outputs.begin(), node.outputs.begin() + static_cast<std::ptrdiff_t>(i), output) !=
        node.outputs.begin() + static_cast<std::ptrdiff_t>(i))
      throw Error(cat(node.op, " '", node.name, "': output '", info.name, "' is given twice"));
  }
  for (ValueId output : node.outputs) values_.at(output).producer = node.id;
  for (ValueId input : node.inputs)  // a value read twice by one node counts it once
    if (std::vector<NodeId>& readers = readers_[static_cast<size_t>(input)]; readers.empty() || readers.back() != node.id)
      readers.push_back(node.id);
  nodes_.push_back(std::move(node));
  return nodes_.back().id;
}

int Graph::add_param(ParamInfo info) {
  // The parameter's value: a Parameter that names this slot, as GraphBuilder::parameter makes it.
  const int index = static_cast<int>(params_.size());
  const ValueInfo& value = this->value(info.value);
  if (value.role != ValueRole::Parameter || value.param_index != index)
    throw Error(cat("parameter '", info.name, "': value ", info.value, " ('", value.name,
                    "') is not the parameter value of slot ", index));
  if (info.grad != -1) throw Error(cat("parameter '", info.name, "': a new parameter has no gradient yet"));
  params_.push_back(std::move(info));
  return static_cast<int>(params_.size()) - 1;
}

const std::vector<NodeId>& Graph::consumers(ValueId value) const {
  this->value(value);  // exists
  return readers_[static_cast<size_t>(value)];
}

bool Graph::has_name(const std::string& name) const {
  for (const ValueInfo& info : values_)
    if (info.name == name && info.role != ValueRole::Activation) return true;
  return false;
}

ValueId Graph::find(const std::string& name) const {
  for (const ValueInfo& info : values_)
    if (info.name == name && info.role != ValueRole::Activation) return info.id;
  throw Error(cat("graph has no input or parameter named '", name, "'"));
}

}  // namespace quiver
