// The loop behind `megadecode generate`: one sequence through any Backend — prefill the prompt,
// sample the first token on the host, then one decode step per token — streaming each token to a
// callback as it is sampled. Stops at an eos token (unless ignore_eos) or after max_tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "sampling/params.h"

namespace megadecode {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 16;
  bool ignore_eos = false;
  std::vector<int> eos_token_ids;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated tokens, the eos token included when it stopped there
  std::string finish_reason;    // "stop" (eos) or "length" (max_tokens)
};

// KV blocks of `block_size` the request needs: its prompt and every generated token but the last.
int blocks_needed(const GenerateRequest& request, int block_size);

// Runs the request as sequence 0 on blocks 0, 1, 2, ... of the backend. Error when the prompt is
// empty, max_tokens < 1, a prompt token is outside the vocabulary, or the backend has too few blocks.
GenerateResult generate(Backend& backend, const GenerateRequest& request,
                        const std::function<void(int32_t)>& on_token);

}  // namespace megadecode
