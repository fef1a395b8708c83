// Per-request sampling settings and their one contract, shared by the engine, the server, the host
// sampler and the device samplers (semantics follow vLLM):
//   - validate() is the one range check: the server, the engine and every backend call it;
//   - greedy() is the one greedy rule (temperature below kGreedyTemperature: argmax);
//   - ties go to the lower token id everywhere: equal logits order lower ids first, so top-k keeps
//     exactly k tokens, and an argmax or a Gumbel-max draw that ties picks the lower id.
// top_k <= 0, top_p = 1 and min_p = 0 disable those filters; penalties apply to the logits before
// temperature.
#pragma once

#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/host_device.h"

namespace megadecode {

// vLLM's _SAMPLING_EPS: a temperature below it samples greedily.
constexpr float kGreedyTemperature = 1e-5f;

struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;  // with `position`, picks the random numbers: same seed and position, same token
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;

  MD_HOST_DEVICE bool greedy() const { return temperature < kGreedyTemperature; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

namespace sampling {

// A parameter out of range; field() is its name (the OpenAI request field, e.g. "top_p").
class ParamError : public Error {
 public:
  ParamError(std::string field, const std::string& message) : Error(message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// The ranges: temperature in [0, 100], top_k >= -1 (-1 and 0: off), top_p in (0, 1], min_p in
// [0, 1], presence and frequency penalties in [-2, 2], repetition penalty in (0, 100]; NaN is out
// of every range. Throws ParamError naming the first field out of range.
void validate(const SamplingParams& params);

}  // namespace sampling
}  // namespace megadecode
