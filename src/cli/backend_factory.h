// make_backend: the one place that maps a backend name (--backend) to an implementation.
// cpu-ref, cpu-mk, and (in builds with CUDA) cuda-mk and cuda-ops.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "model/weights.h"

namespace megadecode {

struct BackendOptions {
  int kv_block_size = 16;
  int n_kv_blocks = 0;  // KV blocks the backend stores (> 0)
  int n_threads = 0;    // CPU backends: worker threads, 0 = one per hardware thread
  double gpu_memory_utilization = 0.9;  // CUDA backends: share of GPU memory for weights + KV (n_kv_blocks 0)
  int prefill_chunk = -1;  // CUDA backends: tokens per prefill kernel pass; 0: the decode path one
                           // token at a time; -1: the backend's default
  std::string attention;  // CUDA backends: the megakernel's attention item (scalar | tc | tc2); "": default
};

// `weights_owner` keeps the bytes behind `weights` alive for the backend's lifetime.
// Error for an unknown name (listing the known ones) or bad options.
std::unique_ptr<Backend> make_backend(const std::string& name, const ModelConfig& config, const ModelWeights& weights,
                                      std::shared_ptr<const void> weights_owner, const BackendOptions& options);

// A GPU backend (cuda-mk or cuda-ops) with the synthetic weights `make-model --seed weights_seed`
// would write, generated on the GPU (no files). Error for other names or builds without CUDA.
std::unique_ptr<Backend> make_backend_with_random_weights(const std::string& name, const ModelConfig& config,
                                                          uint64_t weights_seed, const BackendOptions& options);

std::vector<std::string> backend_names();

}  // namespace megadecode
