// Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}} with an HTTP status.
// Request handlers throw ApiError; the HTTP layer turns it into the response.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

namespace megadecode {

struct ApiError : std::runtime_error {
  ApiError(int status_, std::string message, std::string type_, std::optional<std::string> param_ = std::nullopt,
           std::optional<std::string> code_ = std::nullopt)
      : std::runtime_error(message), status(status_), type(std::move(type_)), param(std::move(param_)),
        code(std::move(code_)) {}
  int status;
  std::string type;
  std::optional<std::string> param;
  std::optional<std::string> code;

  std::string body() const;  // the JSON text
};

inline ApiError bad_request(const std::string& message, std::optional<std::string> param = std::nullopt,
                            std::optional<std::string> code = std::nullopt) {
  return ApiError(400, message, "invalid_request_error", std::move(param), std::move(code));
}
inline ApiError not_found(const std::string& message, std::optional<std::string> param = std::nullopt,
                          std::optional<std::string> code = std::nullopt) {
  return ApiError(404, message, "invalid_request_error", std::move(param), std::move(code));
}
inline ApiError server_error(const std::string& message) { return ApiError(500, message, "server_error"); }

}  // namespace megadecode
