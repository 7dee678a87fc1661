#include "tests/ops/op_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/autodiff.h"
#include "runtime/param_store.h"
#include "runtime/plan.h"

namespace quiver::testing {

Host draw_values(const InputSpec& spec, std::mt19937_64& rng) {
  int64_t count = spec.shape.numel();
  Host values(count);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  switch (spec.draw) {
    case Draw::Smooth:
      for (double& v : values) v = unit(rng);
      break;
    case Draw::AwayFromZero:
      for (double& v : values) {
        double magnitude = 0.1 + 0.9 * std::abs(unit(rng));
        v = unit(rng) < 0 ? -magnitude : magnitude;
      }
      break;
    case Draw::Distinct:
      for (int64_t i = 0; i < count; ++i) values[i] = 0.05 * static_cast<double>(i - count / 2);
      std::shuffle(values.begin(), values.end(), rng);
      break;
    case Draw::Labels:
      for (double& v : values) v = static_cast<double>(rng() % spec.classes);
      break;
  }
  return values;
}

namespace {

// The case's graph: y = op(inputs), loss = sum(y * R), and its backward.
struct CaseGraph {
  GraphBuilder builder;
  std::vector<Value> inputs;
  Value output, weights, loss;
  std::vector<Host> values;
  Host weight_values;
  std::unique_ptr<ParamStore> store;

  // Float inputs are parameters, all of them or (only_input >= 0) that one alone; the others are
  // graph inputs, which no gradient is asked of.
  explicit CaseGraph(const OpCase& op_case, bool with_backward, int only_input = -1, uint64_t seed = 7) {
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i < op_case.inputs.size(); ++i) {
      const InputSpec& spec = op_case.inputs[i];
      std::string name = "in" + std::to_string(i);
      const bool parameter = only_input < 0 || static_cast<int>(i) == only_input;
      inputs.push_back(spec.draw == Draw::Labels ? builder.input(name, spec.shape, DType::I32)
                       : parameter               ? builder.parameter(name, spec.shape, ParamInit::zeros())
                                                 : builder.input(name, spec.shape));
      values.push_back(draw_values(spec, rng));
    }
    output = op_case.build(builder, inputs);
    int64_t count = builder.shape(output).numel();
    Value flat = builder.reshape(output, Shape{1, count}, "flat");
    weights = builder.input("R", Shape{count, 1});
    weight_values = draw_values(InputSpec{Shape{count}}, rng);
    loss = builder.reshape(builder.matmul(flat, weights, false, false, "dot"), Shape{}, "loss");
    if (with_backward) build_backward(builder, loss);
    store = std::make_unique<ParamStore>(builder.graph());
  }

  void load(Plan& plan) const {
    const Graph& graph = builder.graph();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ValueInfo& info = graph.value(inputs[i].id);
      const Tensor& tensor = info.role == ValueRole::Input ? plan.input(info.name) : store->param(info.param_index);
      for (int64_t k = 0; k < tensor.numel(); ++k) {
        if (info.dtype == DType::I32)
          tensor.i32()[k] = static_cast<int32_t>(values[i][k]);
        else
          tensor.f32()[k] = static_cast<float>(values[i][k]);
      }
    }
    for (size_t k = 0; k < weight_values.size(); ++k)
      plan.input("R").f32()[k] = static_cast<float>(weight_values[k]);
  }

  Host output_of(const Plan& plan) const {
    const Tensor& y = plan.tensor(output);
    return Host(y.f32(), y.f32() + y.numel());
  }

  double loss_in_double(const Plan& plan) const {
    Host y = output_of(plan);
    double sum = 0.0;
    for (size_t k = 0; k < y.size(); ++k) sum += y[k] * weight_values[k];
    return sum;
  }
};

void expect_close(const Host& got, const Host& expected, double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (size_t k = 0; k < got.size(); ++k)
    ASSERT_NEAR(got[k], expected[k], tolerance * std::max(1.0, std::abs(expected[k])))
        << what << " element " << k;
}

}  // namespace

std::vector<std::string> op_kinds_of(const OpCase& op_case) {
  const CaseGraph graph(op_case, /*with_backward=*/true);
  std::vector<std::string> kinds;
  for (const Node& node : graph.builder.graph().nodes()) kinds.push_back(node.op);
  return kinds;
}

static PlanOptions plan_options(int threads, const std::string& prefer_kernel) {
  PlanOptions options;
  options.threads = threads;
  options.prefer_kernel = prefer_kernel;
  return options;
}

void check_forward(const OpCase& op_case) {
  CaseGraph graph(op_case, false);
  Host expected = op_case.reference(graph.values);
  std::vector<std::pair<std::string, PlanOptions>> variants = {
      {"default kernels, 1 thread", plan_options(1, "")},
      {"default kernels, 2 threads", plan_options(2, "")},
      {"reference kernels", plan_options(1, "reference")},
      {"im2col_gemm kernels, 2 threads", plan_options(2, "im2col_gemm")},
  };
  for (const auto& [label, options] : variants) {
    Plan plan(graph.builder.graph(), *graph.store, {graph.output}, options);
    graph.load(plan);
    plan.run();
    expect_close(graph.output_of(plan), expected, op_case.forward_tolerance, op_case.name + " (" + label + ")");
  }
}

void check_gradient(const OpCase& op_case) {
  // The default kernels and the second-choice ones where an op has them (conv2d's im2col_gemm),
  // on 1 and on 3 threads; then the reference kernels.
  for (const int threads : {1, 3}) {
    check_gradient_with(op_case, "", threads);
    check_gradient_with(op_case, "im2col_gemm", threads);
  }
  check_gradient_with(op_case, "reference");
  // Then each float input alone, where there are several: the backward an op builds when only some
  // of its inputs need a gradient (a matmul's one side, the LSTM's dx left out) is another branch.
  int floats = 0;
  for (const InputSpec& spec : op_case.inputs) floats += spec.draw != Draw::Labels;
  if (floats < 2) return;
  for (size_t i = 0; i < op_case.inputs.size(); ++i)
    if (op_case.inputs[i].draw != Draw::Labels)
      for (const std::string kernels : {"", "reference"})
        check_gradient_with(op_case, kernels, 1, static_cast<int>(i));
}

void check_gradient_with(const OpCase& op_case, const std::string& prefer_kernel, int threads, int only_input) {
  CaseGraph graph(op_case, true, only_input);
  const Graph& g = graph.builder.graph();
  std::vector<Value> fetches{graph.output};
  for (const ParamInfo& param : g.params()) fetches.push_back(Value{param.grad});
  Plan plan(g, *graph.store, fetches, plan_options(threads, prefer_kernel));
  graph.load(plan);
  plan.run();

  // Every gradient is read before any perturbation: the finite-difference runs rewrite them.
  const Tensor& flat_grads = graph.store->flat_grads();
  const Host all_analytic(flat_grads.f32(), flat_grads.f32() + flat_grads.numel());
  std::mt19937_64 rng(11);
  for (size_t index = 0; index < g.params().size(); ++index) {
    const Tensor param = graph.store->param(static_cast<int>(index));
    const int64_t offset = graph.store->slots()[index].offset;
    Host analytic(all_analytic.begin() + offset, all_analytic.begin() + offset + param.numel());
    std::vector<int64_t> elements(param.numel());
    for (int64_t k = 0; k < param.numel(); ++k) elements[k] = k;
    std::shuffle(elements.begin(), elements.end(), rng);
    elements.resize(std::min<size_t>(elements.size(), op_case.max_checked_elements));
    for (int64_t k : elements) {
      float original = param.f32()[k];
      param.f32()[k] = static_cast<float>(original + op_case.epsilon);
      plan.run();
      double plus = graph.loss_in_double(plan);
      param.f32()[k] = static_cast<float>(original - op_case.epsilon);
      plan.run();
      double minus = graph.loss_in_double(plan);
      param.f32()[k] = original;
      double numeric = (plus - minus) / (2.0 * op_case.epsilon);
      ASSERT_NEAR(analytic[k], numeric, op_case.gradient_tolerance * std::max(1.0, std::abs(numeric)))
          << op_case.name << " [" << (prefer_kernel.empty() ? "default" : prefer_kernel) << " kernels, " << threads
          << " thread(s)" << (only_input < 0 ? "" : ", that input alone") << "]: d loss / d " << g.params()[index].name << "[" << k << "]";
    }
  }
}

}  // namespace quiver::testing
