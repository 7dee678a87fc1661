// quiver::Error: the one exception type the library throws.
// Messages name the op, the node and the shapes involved (or the file and the problem),
// so a user can find the mistake without a debugger. Library code never aborts or exits.
#pragma once

#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace quiver {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Builds a message from any streamable pieces: throw Error(cat("matmul '", name, "': ..."));
template <typename... Parts>
std::string cat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

// A number as a user typed it, to 12 significant digits: cat() rounds to 6, so a momentum of
// 0.99999999 or a factor of 0.9999999 would read "1" in a message or a header.
inline std::string number_text(double value) {
  std::ostringstream out;
  out << std::setprecision(12) << value;
  return out.str();
}

}  // namespace quiver
