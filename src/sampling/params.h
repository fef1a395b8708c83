// Per-request sampling settings, shared by the host sampler, the device sampler and the engine.
// Semantics follow vLLM: temperature 0 is greedy; top_k <= 0 and top_p = 1 and min_p = 0 disable
// those filters; penalties apply to the logits before temperature.
#pragma once

#include <cstdint>

namespace megadecode {

struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;  // with `position`, picks the random numbers: same seed and position, same token
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;

  bool greedy() const { return temperature <= 0.0f; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

}  // namespace megadecode
