// The composition root: the one place that knows every backend and maps BackendOptions::backend
// (--backend) to an implementation: cpu-ref, cpu-mk and, in builds with CUDA, cuda-mk and
// cuda-ops. The options reach the backend unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "model/weights.h"

namespace megadecode {

// `weights_owner` keeps the bytes behind `weights` alive for the backend's lifetime.
// Error for an unknown backend (listing the known ones) or bad options.
std::unique_ptr<Backend> make_backend(const ModelConfig& config, const ModelWeights& weights,
                                      std::shared_ptr<const void> weights_owner, const BackendOptions& options);

// A GPU backend (cuda, cuda-mk, cuda-ops or cuda-batched) with the synthetic weights `make-model --seed weights_seed`
// would write, generated on the GPU (no files). Error for other backends or builds without CUDA.
std::unique_ptr<Backend> make_backend_with_random_weights(const ModelConfig& config, uint64_t weights_seed,
                                                          const BackendOptions& options);

std::vector<std::string> backend_names();

}  // namespace megadecode
