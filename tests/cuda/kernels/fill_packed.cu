// Test-only kernel: synthetic weights written straight into the packed layout (weight_pack.cuh).
#include <algorithm>

#include "core/check.h"
#include "core/rng.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/weight_pack.cuh"
#include "kernels.h"

namespace megadecode::cuda {
namespace {

__global__ void fill_packed_uniform_kernel(uint16_t* __restrict__ packed, int n_rows, int k, uint64_t seed,
                                           uint64_t stream_id, float scale, int64_t n_elements) {
  const int64_t n_kb = pack_k_blocks(k);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_elements; i += int64_t(gridDim.x) * blockDim.x) {
    const PackedCoord c = packed_coord(i, n_kb);
    packed[i] = (c.row < n_rows && c.k < k)
                    ? float_to_bf16_bits(scale * uniform_at(seed, stream_id, uint64_t(c.row) * k + c.k))
                    : uint16_t(0);
  }
}

}  // namespace

void fill_packed_uniform(uint16_t* packed, int n_rows, int k, uint64_t seed, uint64_t stream_id, float scale,
                         cudaStream_t stream) {
  MD_REQUIRE(n_rows > 0 && k > 0, "fill_packed_uniform: bad shape [", n_rows, ", ", k, "]");
  const int64_t n = packed_elements(n_rows, k);
  const int grid = static_cast<int>(std::min<int64_t>((n + 255) / 256, 132 * 16));
  fill_packed_uniform_kernel<<<grid, 256, 0, stream>>>(packed, n_rows, k, seed, stream_id, scale, n);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda
