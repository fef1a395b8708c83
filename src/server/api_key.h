// Bearer API keys (`serve --api-key KEY` or MEGADECODE_API_KEY, vLLM's flag): every route needs
// "Authorization: Bearer KEY" except /health, and /metrics unless `--protect-metrics`. A missing
// or wrong key is a 401 in OpenAI's shape (code "invalid_api_key"). The comparison takes the same
// time wherever the keys differ, so response times do not reveal the key.
// Threading: immutable after construction.
#pragma once

#include <string>
#include <string_view>

#include "server/api_error.h"

namespace megadecode {

// Equality whose running time depends only on the lengths, never on where the bytes differ.
bool constant_time_equal(std::string_view a, std::string_view b);

class ApiKeyGuard {
 public:
  ApiKeyGuard() = default;  // no key: every route is open
  ApiKeyGuard(std::string key, bool protect_metrics);

  bool enabled() const { return !key_.empty(); }
  // Whether `path` needs the key.
  bool protects(const std::string& path) const;
  // Whether an Authorization header value carries the key ("Bearer KEY", the scheme in any case).
  bool accepts(std::string_view authorization) const;

 private:
  std::string key_;
  bool protect_metrics_ = false;
};

// The 401 for a request without the right key.
ApiError invalid_api_key();

}  // namespace megadecode
