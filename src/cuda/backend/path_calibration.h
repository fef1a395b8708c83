// The `cuda` backend's path policy, measured when it starts: both paths' decode step at batches
// 1..min(8, the megakernel's and the backend's largest batch), at one context (8192 tokens, or
// less where the KV pools or the model's positions do not hold it), timed as bench decode times a
// step (CUDA-graph replays of the step, median); DecodePathPolicy::crossover_from turns the times
// into the crossover. The rows are synthetic: random tokens in blocks of the empty pools (the
// engine has allocated none yet), whose zeroed K/V the steps read; what they write there is never
// read (a block's later owner overwrites each position before attending to it). About a second on
// the full shapes.
#pragma once

#include <string>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "engine/decode_path.h"

namespace megadecode::cuda {

struct PathCalibration {
  int context = 0;
  std::vector<double> megakernel_ms, batched_ms;  // [batch - 1]
  DecodePathPolicy policy;
  std::string summary() const;  // one line: the crossover and the times
};

// Measures the policy, sets it on the backend (CudaBackend::set_path_policy) and returns it with the
// times; Error when the backend lacks either path (the policy then stays as it was). Runs steps:
// call it before the engine owns any block.
PathCalibration calibrate_decode_path(CudaBackend& be, uint64_t seed = 1);

}  // namespace megadecode::cuda
