// RMSNorm of one row by a whole CTA (device building block) — the layer's input/post-attention
// norms and the final norm. HF order: fp32 mean of squares, x * rsqrt(mean + eps) rounded to bf16,
// then times the bf16 weight, rounded to bf16 (the GEMM's activation input).
// Deterministic: each thread sums a fixed strided subset, warps reduce by a fixed butterfly, warp
// partials are added in warp order.
#pragma once

#include <cstdint>

#include "core/bf16.h"
#include "cuda/common/warp.cuh"

namespace megadecode::cuda {

__device__ __forceinline__ float load_as_float(const float* p) { return *p; }
__device__ __forceinline__ float load_as_float(const uint16_t* p) { return bf16_bits_to_float(*p); }

// Sum of `v` over the CTA, in a fixed order; `scratch` holds >= 32 floats of shared memory.
// Every thread of the CTA must call it; all get the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < n_warps; ++w) s += scratch[w];
  return s;
}

// out[0..n) = rms_norm(x[0..n)) * weight. Whole CTA; `scratch`: >= 32 floats of shared memory.
// x may be written by other CTAs in this launch: plain (coherent) loads only.
template <typename T>
__device__ void rms_norm_row(const T* x, const uint16_t* __restrict__ weight, uint16_t* out, int n, float eps,
                             float* scratch) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = load_as_float(x + i);
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss, scratch) / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float normed = round_bf16(load_as_float(x + i) * r);
    out[i] = float_to_bf16_bits(normed * bf16_bits_to_float(weight[i]));
  }
}

}  // namespace megadecode::cuda
