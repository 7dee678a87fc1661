// Whether a coefficient given as a double keeps its meaning in the kernels' 32-bit floats.
//
// Options arrive as doubles (the API, the command line) and the kernels compute in floats, read
// with subnormals flushed to zero (core/denormals.h). A fraction such as a momentum or SMA's mu_z
// checked in [0, 1) as a double can still round to 1.0f (0.99999999 does), where a momentum
// never decays and Adam's bias correction divides by zero; a tiny nonzero one (1e-39) is a
// subnormal float, read as 0. Both are refused where the option is checked, with the reason.
#pragma once

#include <cmath>
#include <limits>
#include <string>

#include "core/error.h"

namespace quiver {

// Why `value`, meant as a fraction in [0, 1) (or [0, 1] when `one_allowed`), is not one in the
// kernels' floats; empty when it is. The reason reads after the option's name: "momentum " + it.
inline std::string float_fraction_problem(double value, bool one_allowed) {
  const char* range = one_allowed ? "[0, 1]" : "[0, 1)";
  if (!(value >= 0.0 && (one_allowed ? value <= 1.0 : value < 1.0))) return cat("must be in ", range, ", got ", value);
  if (!one_allowed && static_cast<float>(value) >= 1.0f)
    return cat(number_text(value), " rounds to 1 in the 32-bit floats training computes in; the largest float below 1 is ",
               number_text(std::nextafter(1.0f, 0.0f)));
  if (value != 0.0 && value < std::numeric_limits<float>::min())
    return cat(number_text(value), " is below the smallest normal 32-bit float (", std::numeric_limits<float>::min(),
               "), which the kernels read as 0: give 0 or at least that");
  return {};
}

}  // namespace quiver
