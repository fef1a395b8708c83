// The JSON of a request body and the small readers every request parser shares: whether the
// body is declared JSON, a field that is set (null counts as absent) and a boolean field, each a
// 400 naming the field when malformed.
// Bodies keep their key order (nlohmann::ordered_json): tool definitions reach the chat
// template in the order the client wrote them.
#pragma once

#include <cctype>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "server/api_error.h"

namespace megadecode {

using RequestJson = nlohmann::ordered_json;

// Whether a Content-Type header names JSON ("application/json", any case, parameters allowed).
inline bool is_json_media_type(std::string_view content_type) {
  const std::string_view media = content_type.substr(0, content_type.find(';'));
  size_t b = 0, e = media.size();
  while (b < e && (media[b] == ' ' || media[b] == '\t')) ++b;
  while (e > b && (media[e - 1] == ' ' || media[e - 1] == '\t')) --e;
  constexpr std::string_view kJson = "application/json";
  if (e - b != kJson.size()) return false;
  for (size_t i = 0; i < kJson.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(media[b + i])) != kJson[i]) return false;
  return true;
}

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
