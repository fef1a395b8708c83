// Named model shapes: `tiny` (CPU tests in seconds, real Qwen3 vocabulary), `small` (full
// Qwen3-30B-A3B widths, all 128 experts, 2 layers) and `qwen3-30b-a3b` (the exact full shape);
// for North Mini Code (cohere2_moe) `north-tiny` (CPU tests: narrow, a 24-key sliding window),
// `north-small` (full widths, 5 layers: dense, 3 sliding, full) and `north-mini-code` (49 layers).
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace megadecode {

ModelConfig preset_config(const std::string& name);  // Error for an unknown name
std::vector<std::string> preset_names();

}  // namespace megadecode
