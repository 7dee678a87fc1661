// How a JSON value read from a file (a checkpoint's header, a profile cache) is shown in an error
// message. Not a printer: nlohmann's dump() recurses into arrays and objects, and a crafted file's
// value nested a million deep (which its parser reads without recursion) would overflow the stack
// when printed, so containers are named by kind and size only.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace quiver {

// A scalar as written (cut to 64 characters; bytes that are not UTF-8 replaced); an array or an
// object by its kind and size.
inline std::string json_for_message(const nlohmann::json& value) {
  if (value.is_array()) return cat("an array of ", value.size());
  if (value.is_object()) return cat("an object of ", value.size(), " keys");
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return text;
}

}  // namespace quiver
