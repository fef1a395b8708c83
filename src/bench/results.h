// What every benchmark reports with: the median of its samples and its JSON file.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace megadecode {

// The median (the mean of the middle two for an even count); 0 for no samples.
double median(std::vector<double> samples);

// Writes j to `path` (indent < 0: one line); Error naming the path when it cannot be written.
void write_json(const std::string& path, const nlohmann::json& j, int indent = 2);

}  // namespace megadecode
