// One call that builds a CUDA backend (cuda, cuda-mk, cuda-ops or cuda-batched) with its device
// weights, for the composition root (cli/backend_factory.h); the `cuda` backend then measures its
// decode path crossover (path_calibration.h). No CUDA types here.
// Weights: a loaded checkpoint (uploaded and packed, progress on stderr) or, when `weights` is
// null, synthetic weights of `seed` generated on the GPU (what `make-model --seed` would write).
#pragma once

#include <cstdint>
#include <memory>

#include "engine/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace megadecode {

// Error for an unknown backend, a model the device path cannot run, or no GPU.
std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& config, const ModelWeights* weights, uint64_t seed,
                                           const BackendOptions& options);

}  // namespace megadecode
