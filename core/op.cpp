#include "core/op.h"

#include <algorithm>

#include "core/builder.h"
#include "core/error.h"

namespace quiver {

void InferContext::fail(const std::string& what) const {
  std::string shapes;
  for (size_t i = 0; i < inputs.size(); ++i) shapes += cat(i ? ", " : "", inputs[i].shape.str());
  throw Error(cat(node.op, " '", node.name, "': ", what, " (input shapes ", shapes, ")"));
}

GradContext::GradContext(GraphBuilder& builder, const Node& node, std::vector<Value> output_grads,
                         std::vector<bool> needs_grad)
    : builder_(builder), node_(node), output_grads_(std::move(output_grads)),
      input_grads_(node.inputs.size()), needs_grad_(std::move(needs_grad)) {}

Value GradContext::input(int i) const { return builder_.graph().handle(node_.inputs.at(static_cast<size_t>(i))); }
Value GradContext::output(int i) const { return builder_.graph().handle(node_.outputs.at(static_cast<size_t>(i))); }

Shape GradContext::input_shape(int i) const {
  return builder_.graph().value(node_.inputs.at(i)).shape;
}

void GradContext::no_gradient_through(int output, const std::string& what) const {
  if (output_grad(output).valid())
    throw Error(cat(node_.op, " '", node_.name, "': output ", output, " (", what,
                    ") reaches the loss, but this op has no gradient through it"));
}

void GradContext::set_input_grad(int i, Value grad) {
  const Shape expected = input_shape(i);
  const Shape& got = builder_.graph().value(grad.id).shape;
  if (got != expected)
    throw Error(cat(node_.op, " '", node_.name, "': gradient of input ", i, " has shape ",
                    got.str(), " but the input is ", expected.str()));
  input_grads_.at(i) = grad;
}

std::string GradContext::name(const std::string& suffix) const {
  return node_.name + "/grad/" + suffix;
}

OpRegistry& OpRegistry::global() {
  static OpRegistry registry;
  return registry;
}

std::string OpDef::unknown_attribute(const Attrs& attrs) const {
  for (const auto& [key, value] : attrs.all()) {
    if (std::ranges::find(attributes, key) != attributes.end()) continue;
    if (attributes.empty()) return cat("unknown attribute '", key, "'; ", kind, " takes no attributes");
    std::string takes;
    for (const std::string& name : attributes) takes += cat(takes.empty() ? "" : ", ", name);
    return cat("unknown attribute '", key, "'; ", kind, " takes ", takes);
  }
  return {};
}

void OpRegistry::add(OpDef def) {
  if (has(def.kind)) throw Error(cat("op '", def.kind, "' is registered twice"));
  for (int written : def.written_inputs)  // indexes into a node's inputs (the plan and the builder read them)
    if (written < 0 || std::count(def.written_inputs.begin(), def.written_inputs.end(), written) > 1)
      throw Error(cat("op '", def.kind, "': written input ", written, " is negative or listed twice"));
  std::string kind = def.kind;
  defs_.push_back(std::move(def));
  std::vector<Pending> waiting;
  waiting.swap(pending_);
  for (Pending& pending : waiting) {
    if (pending.kind == kind)
      add_kernel(kind, std::move(pending.impl), pending.prefer);
    else
      pending_.push_back(std::move(pending));
  }
}

void OpRegistry::add_kernel(const std::string& kind, KernelImpl impl, bool prefer) {
  for (OpDef& def : defs_)
    if (def.kind == kind) {
      auto position = prefer ? def.kernels.begin() : def.kernels.end();
      def.kernels.insert(position, std::move(impl));
      return;
    }
  pending_.push_back({kind, std::move(impl), prefer});
}

std::vector<std::string> OpRegistry::orphan_kernel_kinds() const {
  std::vector<std::string> kinds;
  for (const Pending& pending : pending_) kinds.push_back(pending.kind);
  return kinds;
}

const OpDef& OpRegistry::get(const std::string& kind) const {
  for (const OpDef& def : defs_)
    if (def.kind == kind) return def;
  // No ops at all: the library's op files were dropped at link time (a static library linked
  // without --whole-archive keeps only the objects something calls).
  if (defs_.empty())
    throw Error(cat("unknown op '", kind, "': no op is registered (link the library whole: the CMake target ",
                    "quiver::quiver does, a plain libquiver.a does not)"));
  throw Error(cat("unknown op '", kind, "'"));
}

bool OpRegistry::has(const std::string& kind) const {
  for (const OpDef& def : defs_)
    if (def.kind == kind) return true;
  return false;
}

std::vector<std::string> OpRegistry::kinds() const {
  std::vector<std::string> names;
  for (const OpDef& def : defs_) names.push_back(def.kind);
  return names;
}

bool register_op(OpDef def) {
  OpRegistry::global().add(std::move(def));
  return true;
}

}  // namespace quiver
