// The one JSON file writer: benchmark reports, make-model's config files, anything written as JSON.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace megadecode {

// Writes j to `path` (indent < 0: one line) and a final newline; Error naming the path when it
// cannot be written.
void write_json(const std::string& path, const nlohmann::json& j, int indent = 2);

}  // namespace megadecode
