// The JSON of a request body and the small readers every request parser shares: a field that is
// set (null counts as absent) and a boolean field, each a 400 naming the field when malformed.
// Bodies keep their key order (nlohmann::ordered_json): tool definitions reach the chat
// template in the order the client wrote them.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "server/api_error.h"

namespace megadecode {

using RequestJson = nlohmann::ordered_json;

inline const RequestJson* request_field(const RequestJson& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

inline std::optional<bool> request_bool(const RequestJson& body, const char* name) {
  const RequestJson* v = request_field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(cat("'", name, "' must be a boolean"), name);
  return v->get<bool>();
}

}  // namespace megadecode
