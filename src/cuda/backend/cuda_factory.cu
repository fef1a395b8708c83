// make_cuda_backend (cuda_factory.h): device weights (uploaded or synthetic) + CudaBackend.
#include <cstdio>

#include "core/check.h"
#include "core/stopwatch.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/backend/cuda_factory.h"
#include "cuda/backend/path_calibration.h"
#include "cuda/common/device_info.h"

namespace megadecode {

std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& config, const ModelWeights* weights, uint64_t seed,
                                           const BackendOptions& options) {
  const std::string& name = options.backend;
  MD_REQUIRE(name == "cuda" || name == "cuda-mk" || name == "cuda-ops" || name == "cuda-batched", "unknown CUDA backend \"",
             name, "\" (known: cuda, cuda-mk, cuda-ops, cuda-batched)");
  cuda::check_supported(config);  // the model first: its error holds whether or not a GPU is here
  MD_REQUIRE(cuda::gpu_available(), name, " needs a CUDA GPU and none is usable");
  const Stopwatch t0;
  auto progress = [&](size_t done, size_t total) {
    std::fprintf(stderr, "\rweights: %zu / %zu MiB", done >> 20, total >> 20);
    if (done == total) std::fprintf(stderr, "\n");
  };
  std::shared_ptr<const cuda::DeviceWeights> w =
      weights ? cuda::DeviceWeights::upload(config, *weights, progress) : cuda::DeviceWeights::synthetic(config, seed);
  std::fprintf(stderr, "%s: %.2f GB of %s weights on the GPU in %.1f s\n", name.c_str(), w->bytes() / 1e9,
               weights ? "checkpoint" : "synthetic",
               t0.seconds());
  auto be = std::make_unique<cuda::CudaBackend>(std::move(w), options);
  if (name == "cuda") {  // both paths: the crossover of this model on this GPU, measured now
    const Stopwatch t1;
    const cuda::PathCalibration cal = cuda::calibrate_decode_path(*be, seed + 1);
    std::fprintf(stderr, "decode path: %s (%.1f s)\n", cal.summary().c_str(), t1.seconds());
  }
  return be;
}

}  // namespace megadecode
