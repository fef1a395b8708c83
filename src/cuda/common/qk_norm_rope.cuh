// Per-head q/k RMSNorm + RoPE (NeoX, rotate-half) + KV-cache append for one token, one warp per
// head (device building block; sits between the QKV GEMM and attention).
// Rounding: normed = bf16(bf16(x * rsqrt(mean(x^2) + eps)) * w) as in rms_norm; RoPE in fp32 with
// inv_freq[i] = 1 / theta^(float(2i) / head_dim) and angle = float(pos) * inv_freq[i] (HF's fp32
// formulas); the result is rounded to bf16 once. V is stored as bf16(v).
//
// Paged KV cache of one layer, K and V each:
//   [n_blocks][n_kv_heads][block_size][head_dim] bf16
// so one (block, kv head) is a contiguous block_size x head_dim page (4 KB for 16 x 128): the unit
// attention streams. Token t of a sequence: block block_table[t / block_size], slot t % block_size.
#pragma once

#include <cstdint>

#include "core/bf16.h"

namespace megadecode::cuda {

// One warp rotates/normalises head vector x (fp32, head_dim = 32 * kPer values; lane holds
// elements [lane*kPer, lane*kPer + kPer)) and returns the bf16-rounded results in `y`.
template <int kPer>
__device__ __forceinline__ void norm_rope_head(float (&v)[kPer], const uint16_t* __restrict__ norm_w, float eps,
                                               bool rope, int pos, float theta) {
  constexpr int kD = 32 * kPer;
  const int lane = threadIdx.x & 31;
  if (norm_w != nullptr) {
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) ss += v[e] * v[e];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / float(kD) + eps);
#pragma unroll
    for (int e = 0; e < kPer; ++e)
      v[e] = round_bf16(round_bf16(v[e] * r) * bf16_bits_to_float(norm_w[lane * kPer + e]));
  }
  if (rope) {
    // Element i pairs with i +- kD/2, which lives in lane +- 16 at the same e.
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const float partner = __shfl_xor_sync(0xffffffffu, v[e], 16);
      const int i = (lane * kPer + e) % (kD / 2);
      const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(kD));
      float s, c;
      sincosf(float(pos) * inv_freq, &s, &c);
      v[e] = lane < 16 ? v[e] * c - partner * s : v[e] * c + partner * s;
    }
  }
#pragma unroll
  for (int e = 0; e < kPer; ++e) v[e] = round_bf16(v[e]);
}

}  // namespace megadecode::cuda
