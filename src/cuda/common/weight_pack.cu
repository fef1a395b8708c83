// Pack kernels for the skinny GEMM's weight layout (see weight_pack.cuh).
#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernels.h"
#include "cuda/common/weight_pack.cuh"

namespace megadecode::cuda {
namespace {

// One thread per lane fragment (8 bf16 = 16 bytes of the packed buffer).
__global__ void pack_weight_kernel(const uint16_t* __restrict__ w, uint16_t* __restrict__ packed, int n_rows, int k,
                                   int64_t n_fragments) {
  const int64_t n_kb = pack_k_blocks(k);
  for (int64_t f = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; f < n_fragments; f += int64_t(gridDim.x) * blockDim.x) {
    uint16_t v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const PackedCoord c = packed_coord(f * 8 + e, n_kb);
      v[e] = (c.row < n_rows && c.k < k) ? w[c.row * k + c.k] : uint16_t(0);
    }
    uint4 out;
    out.x = v[0] | (uint32_t(v[1]) << 16);
    out.y = v[2] | (uint32_t(v[3]) << 16);
    out.z = v[4] | (uint32_t(v[5]) << 16);
    out.w = v[6] | (uint32_t(v[7]) << 16);
    reinterpret_cast<uint4*>(packed)[f] = out;
  }
}

int grid_for(int64_t n_items, int threads) {
  return static_cast<int>(std::min<int64_t>((n_items + threads - 1) / threads, 132 * 16));
}

}  // namespace

void pack_weight(const uint16_t* w, uint16_t* packed, int n_rows, int k, cudaStream_t stream) {
  MD_REQUIRE(n_rows > 0 && k > 0, "pack_weight: bad shape [", n_rows, ", ", k, "]");
  const int64_t n_fragments = packed_elements(n_rows, k) / 8;
  pack_weight_kernel<<<grid_for(n_fragments, 256), 256, 0, stream>>>(w, packed, n_rows, k, n_fragments);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda
