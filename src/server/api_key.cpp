// ApiKeyGuard and the constant-time comparison (see api_key.h).
#include "server/api_key.h"

#include <cstdint>

#include "core/check.h"

namespace megadecode {

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Every byte of the longer string is visited; a length difference counts as a difference.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile uint8_t diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t x = i < a.size() ? static_cast<uint8_t>(a[i]) : 0;
    const uint8_t y = i < b.size() ? static_cast<uint8_t>(b[i]) : 0;
    diff = static_cast<uint8_t>(diff | (x ^ y));
  }
  return diff == 0;
}

ApiKeyGuard::ApiKeyGuard(std::string key, bool protect_metrics) : key_(std::move(key)), protect_metrics_(protect_metrics) {
  for (char c : key_)
    MD_REQUIRE(c > 0x20 && c < 0x7f, "--api-key must be printable ASCII without spaces (it travels in an HTTP header)");
}

bool ApiKeyGuard::protects(const std::string& path) const {
  if (!enabled() || path == "/health") return false;
  return path != "/metrics" || protect_metrics_;
}

bool ApiKeyGuard::accepts(std::string_view authorization) const {
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() < kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i)
    if ((authorization[i] | 0x20) != kScheme[i]) return false;
  std::string_view token = authorization.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
  return constant_time_equal(token, key_);
}

ApiError invalid_api_key() {
  return ApiError(401, "Incorrect or missing API key: send the key as \"Authorization: Bearer KEY\"",
                  "invalid_request_error", std::nullopt, "invalid_api_key");
}

}  // namespace megadecode
