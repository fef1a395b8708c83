// Server-side defaults from the model's generation_config.json (vLLM's behaviour: a request field
// that is not given takes the value from generation_config.json, else the OpenAI default).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "sampling/params.h"
#include "server/openai_request.h"

namespace megadecode {

struct GenerationDefaults {
  SamplingFields sampling;             // temperature, top_p, top_k, min_p, repetition_penalty
  std::optional<int> max_new_tokens;   // default max_tokens
  std::vector<int32_t> eos_token_ids;  // extra end tokens
};

// Reads model_dir/generation_config.json; empty defaults when the file is absent. Error when it
// exists but is malformed.
GenerationDefaults load_generation_defaults(const std::filesystem::path& model_dir);

// request field, else default, else the OpenAI/vLLM default.
SamplingParams resolve_sampling(const SamplingFields& request, const SamplingFields& defaults);

}  // namespace megadecode
