// resolve_chained_tokens (kernels.h).
#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernels.h"

namespace megadecode::cuda {
namespace {

__global__ void resolve_chained_kernel(int32_t* tokens, int n, const int32_t* chain) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int32_t t = tokens[i];
    if (t < 0) tokens[i] = chain[-1 - t];
  }
}

}  // namespace

void resolve_chained_tokens(int32_t* tokens, int n, const int32_t* chain, cudaStream_t stream) {
  MD_REQUIRE(n >= 0 && tokens != nullptr && chain != nullptr, "resolve_chained_tokens: n ", n, ", tokens ",
             static_cast<const void*>(tokens), ", chain ", static_cast<const void*>(chain));
  if (n == 0) return;
  const int threads = 256, blocks = (n + threads - 1) / threads;
  resolve_chained_kernel<<<blocks, threads, 0, stream>>>(tokens, n, chain);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda
