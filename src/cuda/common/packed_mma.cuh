// One k16 step of a GEMM whose A operand is packed weights (weight_pack.cuh): the accumulator
// loop of the megakernel's weight GEMMs (gemm.cuh) and the page-stream microbenchmark (the GEMM
// engine runs wgmma, cuda/gemm). acc[m][j] += A(row block m) * B(token group j) on mma.sync
// m16n8k16 (bf16 in, fp32 accumulate); each lane loads its 16 bytes of row block m's 512-byte
// fragment tile, a_tile(m) (shared memory). Every accumulator gets one MMA per call, so the k
// order of a sum is the caller's loop order. Row blocks m >= n_m are absent (a short page group).
// store_partial / sum_partials below: the warps' partials summed in warp order.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace megadecode::cuda {

template <int kM, int kN, class ATile>
__device__ __forceinline__ void packed_mma_k16(float (&acc)[kM][kN][4], ATile a_tile, const uint32_t (&b0)[kN],
                                               const uint32_t (&b1)[kN], int n_m = kM) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    if (m >= n_m) break;
    const uint4 f = *reinterpret_cast<const uint4*>(a_tile(m) + lane * 16);
    const uint32_t a[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      ptx::mma_bf16_16816(acc[m][j], a, b0[j], b1[j]);
    }
  }
}

// The cross-warp reduction of a row block every weight GEMM shares (the k blocks of a sum are
// dealt to warps, so each warp holds a partial): a warp stores its partial of one row block, tokens
// [0, 8 kN) x rows [0, 16), into `mine` ([token][pitch] floats, row r of token t at t * pitch + r)...
template <int kN>
__device__ __forceinline__ void store_partial(const float (&acc)[kN][4], float* mine, int pitch) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const int tok = j * 8 + 2 * t;
    mine[tok * pitch + g] = acc[j][0];
    mine[(tok + 1) * pitch + g] = acc[j][1];
    mine[tok * pitch + g + 8] = acc[j][2];
    mine[(tok + 1) * pitch + g + 8] = acc[j][3];
  }
}
// ... and, after a barrier, element `at` (t * pitch + r) of the row block is the kWarps partials
// (warp w's at red + w * warp_stride) summed in warp order: the order depends on nothing else.
template <int kWarps>
__device__ __forceinline__ float sum_partials(const float* red, int warp_stride, int at) {
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) s += red[w * warp_stride + at];
  return s;
}

}  // namespace megadecode::cuda
