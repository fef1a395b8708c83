#include "cli/backend_factory.h"

#include "core/check.h"
#include "emu/emulator_backend.h"
#include "ref/ref_backend.h"
#if defined(MEGADECODE_HAVE_CUDA)
#include "cuda/backend/cuda_factory.h"
#endif

namespace megadecode {

std::vector<std::string> backend_names() {
#if defined(MEGADECODE_HAVE_CUDA)
  return {"cpu-ref", "cpu-mk", "cuda-mk", "cuda-ops"};
#else
  return {"cpu-ref", "cpu-mk"};
#endif
}

#if defined(MEGADECODE_HAVE_CUDA)
namespace {
CudaBackendRequest cuda_request(const std::string& name, const BackendOptions& options) {
  CudaBackendRequest request;
  request.name = name;
  request.kv_block_size = options.kv_block_size;
  request.n_kv_blocks = options.n_kv_blocks;
  request.gpu_memory_utilization = options.gpu_memory_utilization;
  request.prefill_chunk = options.prefill_chunk;
  request.attention = options.attention;
  return request;
}
}  // namespace
#endif

std::unique_ptr<Backend> make_backend(const std::string& name, const ModelConfig& config, const ModelWeights& weights,
                                      std::shared_ptr<const void> weights_owner, const BackendOptions& options) {
  MD_REQUIRE(options.attention.empty() || name == "cuda-mk" || name == "cuda-ops", "--attention ",
             options.attention, " is a choice of the CUDA backends (cuda-mk, cuda-ops), not of ", name);
  if (name == "cpu-ref") {
    return std::make_unique<ref::RefBackend>(
        config, weights, std::move(weights_owner),
        ref::RefBackendOptions{options.kv_block_size, options.n_kv_blocks, options.n_threads});
  }
  if (name == "cpu-mk") {
    emu::CpuMkOptions o;  // n_threads: emulated SMs (0: the default 8)
    o.kv_block_size = options.kv_block_size;
    o.n_kv_blocks = options.n_kv_blocks;
    if (options.n_threads > 0) o.n_sms = options.n_threads;
    return std::make_unique<emu::CpuMkBackend>(config, weights, std::move(weights_owner), o);
  }
#if defined(MEGADECODE_HAVE_CUDA)
  if (name == "cuda-mk" || name == "cuda-ops") {
    // The weights are uploaded (packed) to the GPU; the host copy is not needed afterwards.
    CudaBackendRequest request = cuda_request(name, options);
    request.weights = &weights;
    return make_cuda_backend(config, request);
  }
#endif
  std::string known;
  for (const std::string& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(cat("unknown backend \"", name, "\" (known: ", known, ")"));
}

std::unique_ptr<Backend> make_backend_with_random_weights(const std::string& name, const ModelConfig& config,
                                                          uint64_t weights_seed, const BackendOptions& options) {
  MD_REQUIRE(name == "cuda-mk" || name == "cuda-ops",
             "random weights are generated on the GPU: use backend cuda-mk or cuda-ops, not \"", name, "\"");
#if defined(MEGADECODE_HAVE_CUDA)
  CudaBackendRequest request = cuda_request(name, options);
  request.seed = weights_seed;
  return make_cuda_backend(config, request);
#else
  (void)config;
  (void)weights_seed;
  (void)options;
  throw Error("random weights on the GPU need a build with CUDA");
#endif
}

}  // namespace megadecode
