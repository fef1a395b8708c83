#include "cli/backend_factory.h"

#include "core/check.h"
#include "emu/emulator_backend.h"
#include "ref/ref_backend.h"
#if defined(MEGADECODE_HAVE_CUDA)
#include "cuda/backend/cuda_factory.h"
#endif

namespace megadecode {
namespace {

bool is_cuda(const std::string& name) {
  return name == "cuda" || name == "cuda-mk" || name == "cuda-ops" || name == "cuda-batched";
}

}  // namespace

std::vector<std::string> backend_names() {
#if defined(MEGADECODE_HAVE_CUDA)
  return {"cpu-ref", "cpu-mk", "cuda", "cuda-mk", "cuda-ops", "cuda-batched"};
#else
  return {"cpu-ref", "cpu-mk"};
#endif
}

std::unique_ptr<Backend> make_backend(const ModelConfig& config, const ModelWeights& weights,
                                      std::shared_ptr<const void> weights_owner, const BackendOptions& options) {
  const std::string& name = options.backend;
  if (name == "cpu-ref") return std::make_unique<ref::RefBackend>(config, weights, std::move(weights_owner), options);
  if (name == "cpu-mk") return std::make_unique<emu::CpuMkBackend>(config, weights, std::move(weights_owner), options);
#if defined(MEGADECODE_HAVE_CUDA)
  // The weights are uploaded (packed) to the GPU; the host copy is not needed afterwards.
  if (is_cuda(name)) return make_cuda_backend(config, &weights, 0, options);
#endif
  std::string known;
  for (const std::string& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(cat("unknown backend \"", name, "\" (known: ", known, ")"));
}

std::unique_ptr<Backend> make_backend_with_random_weights(const ModelConfig& config, uint64_t weights_seed,
                                                          const BackendOptions& options) {
  MD_REQUIRE(is_cuda(options.backend),
             "random weights are generated on the GPU: use backend cuda, cuda-mk, cuda-ops or cuda-batched, not \"",
             options.backend, "\"");
#if defined(MEGADECODE_HAVE_CUDA)
  return make_cuda_backend(config, nullptr, weights_seed, options);
#else
  (void)config;
  (void)weights_seed;
  throw Error("random weights on the GPU need a build with CUDA");
#endif
}

}  // namespace megadecode
