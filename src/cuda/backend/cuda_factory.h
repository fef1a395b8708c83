// One call that builds a cuda-mk or cuda-ops backend with its device weights, for the CLI
// (`generate --backend cuda-mk --random-weights --preset ...`) and the server. No CUDA types here.
// Weights: a loaded checkpoint (uploaded and packed, progress on stderr) or, when `weights` is
// null, synthetic weights of `seed` generated on the GPU (what `make-model --seed` would write).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace megadecode {

struct CudaBackendRequest {
  std::string name = "cuda-mk";          // cuda-mk | cuda-ops
  const ModelWeights* weights = nullptr;  // nullptr: synthetic weights of `seed`
  uint64_t seed = 0;
  int kv_block_size = 16;
  int n_kv_blocks = 0;                    // 0: from --gpu-memory-utilization
  double gpu_memory_utilization = 0.9;
  std::string policy = "default";
  int prefill_chunk = -1;                 // tokens per prefill pass; 0: one token at a time; -1: default
  std::string attention;                  // scalar | tc | tc2 (cuda/backend/attention_choice.h); "": default
};

// Error for an unknown name, a model the device path cannot run, or no GPU.
std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& config, const CudaBackendRequest& request);

}  // namespace megadecode
