// The consumers' activation fills: the GEMM prologues that put a job's activation window into shared
// memory (bf16 rows, pitch = window + kActPad elements, 16-byte vector loads and stores).
//   RMSNorm fill (QKV, router, expert up, LM head): each row's scale r = 1 / sqrt(mean(v^2) + eps)
//   from the whole fp32 residual row (a warp per row: lane l sums elements 4l + 128j.. in order,
//   then a butterfly), then bf16(bf16(v * r) * weight) — the HF rounding points. Every SM computes
//   the same scale with the same code, so the norm needs no task of its own. Layer 0's residual is
//   the embedding row of the token (bf16, exact in fp32).
//   Row copy (O-proj: the merged attention output; expert down: the up outputs of its slots).
// Rows other SMs wrote in this launch are read with ld.global.cg (after the task's acquire).
#pragma once

#include <cstdint>

#include "cuda/megakernel/sync.cuh"

namespace megadecode::cuda::mk {

// Where an RMSNorm fill reads row r: an fp32 residual, or (x == nullptr) the embedding of tokens[r].
struct NormSource {
  const float* x;          // [rows][H] fp32
  const uint16_t* embed;   // [vocab][H] bf16 (x == nullptr)
  const int32_t* tokens;   // [rows]
  const uint16_t* weight;  // [H] bf16 norm weight
  int32_t H;
  float eps;

  __device__ __forceinline__ float4 load4(int r, int i) const {
    if (x != nullptr) return __ldcg(reinterpret_cast<const float4*>(x + static_cast<int64_t>(r) * H + i));
    const uint2 b = __ldg(reinterpret_cast<const uint2*>(embed + static_cast<int64_t>(tokens[r]) * H + i));
    return make_float4(bf16_bits_to_float(static_cast<uint16_t>(b.x)), bf16_bits_to_float(static_cast<uint16_t>(b.x >> 16)),
                       bf16_bits_to_float(static_cast<uint16_t>(b.y)), bf16_bits_to_float(static_cast<uint16_t>(b.y >> 16)));
  }
};

// scale[r] for rows [0, n_rows): a warp per row. All consumer threads call it; no barrier inside.
__device__ inline void norm_scales(const NormSource& src, int n_rows, float* scale) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < n_rows; r += kConsumerWarps) {
    float ss = 0.0f;
    for (int i = lane * 4; i < src.H; i += 128) {
      const float4 v = src.load4(r, i);
      ss += v.x * v.x;
      ss += v.y * v.y;
      ss += v.z * v.z;
      ss += v.w * v.w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) scale[r] = 1.0f / sqrtf(ss / static_cast<float>(src.H) + src.eps);
  }
}

__device__ __forceinline__ uint32_t normed_pair(float a, float b, float s, uint32_t w2) {
  const float wa = bf16_bits_to_float(static_cast<uint16_t>(w2)), wb = bf16_bits_to_float(static_cast<uint16_t>(w2 >> 16));
  return static_cast<uint32_t>(float_to_bf16_bits(round_bf16(a * s) * wa)) |
         (static_cast<uint32_t>(float_to_bf16_bits(round_bf16(b * s) * wb)) << 16);
}

// Rows [0, n_rows), columns [k0, k0 + kw) of the normed activation into dst (row r at dst + r * pitch).
// kw a multiple of 8. All consumer threads; the caller meets before and after.
__device__ inline void fill_normed(const NormSource& src, const float* scale, int n_rows, int k0, int kw, uint16_t* dst,
                                   int pitch) {
  const int per_row = kw / 8;
  for (int idx = threadIdx.x; idx < n_rows * per_row; idx += kConsumerThreads) {
    const int r = idx / per_row, c = idx % per_row, k = k0 + c * 8;
    const float4 a = src.load4(r, k), b = src.load4(r, k + 4);
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(src.weight + k));
    const float s = scale[r];
    uint4 out;
    out.x = normed_pair(a.x, a.y, s, w.x);
    out.y = normed_pair(a.z, a.w, s, w.y);
    out.z = normed_pair(b.x, b.y, s, w.z);
    out.w = normed_pair(b.z, b.w, s, w.w);
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(r) * pitch + c * 8) = out;
  }
}

// Rows [row0, row0 + n_rows) of a bf16 matrix (stride elements per row), columns [k0, k0 + kw),
// into dst rows 0.. . kw a multiple of 8. All consumer threads; the caller meets before and after.
__device__ inline void fill_rows(const uint16_t* src, int64_t stride, int row0, int n_rows, int k0, int kw, uint16_t* dst,
                                 int pitch) {
  const int per_row = kw / 8;
  for (int idx = threadIdx.x; idx < n_rows * per_row; idx += kConsumerThreads) {
    const int r = idx / per_row, c = idx % per_row;
    const uint4 v = __ldcg(reinterpret_cast<const uint4*>(src + static_cast<int64_t>(row0 + r) * stride + k0 + c * 8));
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(r) * pitch + c * 8) = v;
  }
}

}  // namespace megadecode::cuda::mk
