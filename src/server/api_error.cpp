// ApiError's JSON body.
#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace megadecode {

std::string ApiError::body() const {
  nlohmann::json e = {{"message", what()}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (param) e["param"] = *param;
  if (code) e["code"] = *code;
  // Invalid UTF-8 from a request (echoed in a message) must not make dump() throw.
  return nlohmann::json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace megadecode
