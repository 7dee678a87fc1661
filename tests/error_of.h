// The message of the quiver::Error a call throws, for tests that check what an error says.
#pragma once

#include <string>

#include "core/error.h"

namespace quiver::test {

// `call`'s quiver::Error message, or "(no error)" when it returns.
template <class Call>
std::string error_of(Call&& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

}  // namespace quiver::test
