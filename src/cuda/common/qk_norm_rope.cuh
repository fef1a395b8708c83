// Per-head q/k RMSNorm and RoPE (NeoX halves, or interleaved pairs for models that say so), the
// arithmetic the decode megakernel's attention items (megakernel/attention.cuh) and the prefill
// kernel (prefill/prefill_rope.cu) share, so the K/V both write to the cache are bitwise the same:
// normed = (x * rsqrt(mean(x^2) + eps)) * w in fp32 (a warp per head, lane + 32 j element order,
// butterfly sum), then rotation by the model's RoPE table (cos, sin of float(pos) * inv_freq[i],
// computed on the host as the reference does: backend/device_weights.h).
#pragma once

#include "cuda/common/rms_norm.cuh"

namespace megadecode::cuda {

// rsqrt(mean(x^2) + eps) of a head of D values from one warp's per-lane partial sums of squares.
__device__ __forceinline__ float head_rms_scale(float ss, int D, float eps) {
  return rsqrtf(warp_sum(ss) / static_cast<float>(D) + eps);
}

// Element d of x (a normed head of 2 * half values) rotated by cs = (cos, sin) of its frequency
// d % half at the position (NeoX: element d pairs with d +- half; `low`: d < half). One expression
// for every caller, so the compiler contracts it alike everywhere.
__device__ __forceinline__ float rope_neox_pair(float x, float partner, bool low, float2 cs) {
  return low ? x * cs.x - partner * cs.y : x * cs.x + partner * cs.y;
}
__device__ __forceinline__ float rope_neox(const float* x, int d, int half, float2 cs) {
  return rope_neox_pair(x[d], d < half ? x[d + half] : x[d - half], d < half, cs);
}

// Element d of x rotated in interleaved pairs (config.rope_style kInterleaved: element 2i pairs with
// 2i + 1, frequency i; cs = the table's entry d / 2): ref apply_rope's x[2i] = a c - b s,
// x[2i+1] = b c + a s, through the NeoX pair's expression so every caller contracts it alike.
__device__ __forceinline__ float rope_interleaved(const float* x, int d, float2 cs) {
  return rope_neox_pair(x[d], x[d ^ 1], (d & 1) == 0, cs);
}

}  // namespace megadecode::cuda
