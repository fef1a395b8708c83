// make_cuda_backend (cuda_factory.h): device weights (uploaded or synthetic) + CudaBackend.
#include <chrono>
#include <cstdio>

#include "core/check.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/backend/cuda_factory.h"
#include "cuda/common/device_info.h"

namespace megadecode {

std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& config, const CudaBackendRequest& request) {
  MD_REQUIRE(request.name == "cuda-mk" || request.name == "cuda-ops", "unknown CUDA backend \"", request.name,
             "\" (known: cuda-mk, cuda-ops)");
  MD_REQUIRE(cuda::gpu_available(), request.name, " needs a CUDA GPU and none is usable");
  cuda::check_supported(config);
  const auto t0 = std::chrono::steady_clock::now();
  auto progress = [&](size_t done, size_t total) {
    std::fprintf(stderr, "\rweights: %zu / %zu MiB", done >> 20, total >> 20);
    if (done == total) std::fprintf(stderr, "\n");
  };
  std::shared_ptr<const cuda::DeviceWeights> w =
      request.weights ? cuda::DeviceWeights::upload(config, *request.weights, progress)
                      : cuda::DeviceWeights::synthetic(config, request.seed);
  std::fprintf(stderr, "%s: %.2f GB of %s weights on the GPU in %.1f s\n", request.name.c_str(), w->bytes() / 1e9,
               request.weights ? "checkpoint" : "synthetic",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  cuda::CudaBackendOptions o;
  o.per_op = request.name == "cuda-ops";
  o.kv_block_size = request.kv_block_size;
  o.n_kv_blocks = request.n_kv_blocks;
  o.gpu_memory_utilization = request.gpu_memory_utilization;
  o.policy = request.policy;
  if (request.prefill_chunk >= 0) o.prefill_chunk = request.prefill_chunk;
  if (!request.attention.empty()) o.attention = request.attention;
  return std::make_unique<cuda::CudaBackend>(std::move(w), o);
}

}  // namespace megadecode
