// The one op test harness. An op case is: input shapes and how to draw their values, a builder
// that applies the op, a closed-form or naive-loop reference of its forward, and a finite-
// difference epsilon. check_op_case() runs three modes on it:
//   forward:  the registry's chosen kernel against the reference (and, where the op has another
//             kernel, e.g. "reference", against that kernel; and 2 threads against 1);
//   gradient: the autodiff gradient of L = sum(y * R) (R fixed random) against central finite
//             differences of L computed in double from the float32 forward;
//   errors:   left to each op's own tests.
#pragma once

#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/builder.h"

namespace quiver::testing {

enum class Draw {
  Smooth,        // U(-1, 1)
  AwayFromZero,  // |x| in [0.1, 1]: no relu kink within epsilon
  Distinct,      // values 0.05 apart, shuffled: no max-pool ties within epsilon
  Labels,        // int32 in [0, classes)
};

struct InputSpec {
  Shape shape;
  Draw draw = Draw::Smooth;
  int64_t classes = 0;
};

using Host = std::vector<double>;

// Seeded values for one input as its Draw asks (away from kinks, tie-free, labels in range).
Host draw_values(const InputSpec& spec, std::mt19937_64& rng);

struct OpCase {
  std::string name;
  std::vector<InputSpec> inputs;
  // Applies the op to the inputs (float inputs are parameters, labels are graph inputs).
  std::function<Value(GraphBuilder&, const std::vector<Value>&)> build;
  // Expected output from the input values (row-major, as doubles).
  std::function<Host(const std::vector<Host>&)> reference;
  double epsilon = 1e-2;
  double forward_tolerance = 1e-4;   // relative to max(1, |expected|)
  // Relative to max(1, |numeric|). The largest error over the cases is between 1e-5 and 5e-5
  // (central differences of a float32 forward at epsilon 1e-2): 2e-4 leaves a margin of 4.
  double gradient_tolerance = 2e-4;
  int max_checked_elements = 1 << 30;  // per input; fewer: a seeded sample (every case here is small enough for all)
};

inline void PrintTo(const OpCase& op_case, std::ostream* out) { *out << op_case.name; }

void check_forward(const OpCase& op_case);
// Finite differences against the backward of the default kernels and the second-choice ones, each
// on 1 thread and on 3 (uneven slices of the parallel backward paths: partial sums, row chunks),
// and of the reference kernels; then, where the op has several float inputs, of each alone as the
// one parameter (the others graph inputs), on the default and the reference kernels.
void check_gradient(const OpCase& op_case);
void check_gradient_with(const OpCase& op_case, const std::string& prefer_kernel, int threads = 1,
                         int only_input = -1);
// The op kinds of the case's graph with its backward: what check_forward / check_gradient run.
std::vector<std::string> op_kinds_of(const OpCase& op_case);

}  // namespace quiver::testing
