// One k16 step of a GEMM whose A operand is packed weights (weight_pack.cuh): the accumulator
// loop every weight GEMM shares (the skinny decode GEMM of the megakernel and its standalone
// kernel, the prefill GEMM). acc[m][j] += A(row block m) * B(token group j) on mma.sync
// m16n8k16 (bf16 in, fp32 accumulate); each lane loads its 16 bytes of row block m's 512-byte
// fragment tile, a_tile(m) (shared memory). Every accumulator gets one MMA per call, so the k
// order of a sum is the caller's loop order.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace megadecode::cuda {

template <int kM, int kN, class ATile>
__device__ __forceinline__ void packed_mma_k16(float (&acc)[kM][kN][4], ATile a_tile, const uint32_t (&b0)[kN],
                                               const uint32_t (&b1)[kN]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const uint4 f = *reinterpret_cast<const uint4*>(a_tile(m) + lane * 16);
    const uint32_t a[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
    for (int j = 0; j < kN; ++j) ptx::mma_bf16_16816(acc[m][j], a, b0[j], b1[j]);
  }
}

}  // namespace megadecode::cuda
