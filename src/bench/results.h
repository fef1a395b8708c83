// What every benchmark reports with: its JSON file (and core/stats.h's median of its samples).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/stats.h"

namespace megadecode {

// Writes j to `path` (indent < 0: one line); Error naming the path when it cannot be written.
void write_json(const std::string& path, const nlohmann::json& j, int indent = 2);

}  // namespace megadecode
