// Per-head q/k RMSNorm and RoPE (NeoX halves), the arithmetic the decode megakernel's attention
// items (megakernel/attention.cuh) and the prefill kernel (prefill/prefill_rope.cu) share, so the
// K/V both write to the cache are bitwise the same: normed = (x * rsqrt(mean(x^2) + eps)) * w in
// fp32 (a warp per head, lane + 32 j element order, butterfly sum), then rotation by
// cosf/sinf(float(pos) * inv_freq[d % (D/2)]) with the model's inv_freq table.
#pragma once

#include "cuda/common/rms_norm.cuh"

namespace megadecode::cuda {

// rsqrt(mean(x^2) + eps) of a head of D values from one warp's per-lane partial sums of squares.
__device__ __forceinline__ float head_rms_scale(float ss, int D, float eps) {
  return rsqrtf(warp_sum(ss) / static_cast<float>(D) + eps);
}

// Element d of x (a normed head of 2 * half values) rotated for position pos (NeoX: element d
// pairs with d +- half).
__device__ __forceinline__ float rope_neox(const float* x, int d, int half, int pos, const float* inv_freq) {
  const float ang = static_cast<float>(pos) * inv_freq[d % half];
  const float c = cosf(ang), s = sinf(ang);
  return d < half ? x[d] * c - x[d + half] * s : x[d] * c + x[d - half] * s;
}

}  // namespace megadecode::cuda
