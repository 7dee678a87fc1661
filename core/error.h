// quiver::Error: the one exception type the library throws.
// Messages name the op, the node and the shapes involved (or the file and the problem),
// so a user can find the mistake without a debugger. Library code never aborts or exits.
#pragma once

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

}  // namespace quiver
