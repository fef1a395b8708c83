// Device sampling building blocks. Tokens are totally ordered by a 55-bit key
//   key(i) = orderable(logit_i) << 23 | (2^23 - 1 - i)
// (larger logit first, ties to the lower id): the canonical order of the reference sampler. Every
// filter (min-p, top-k, top-p) keeps a prefix of that order, so the kept set is {i : key(i) >= kappa}
// for one threshold kappa, found by an exact radix select (5 passes of 11 bits; counts and
// probability mass as 64-bit integers, so sums are exact and order-free). The draw is Gumbel-max
// over the kept tokens: argmax_i logit_i / T - log(-log(u_i)), u_i from Philox4x32-10 with counter
// (i, position lo, position hi, 0) and key (seed lo, seed hi), so the same (seed, position) gives
// the same token whatever the batch or the CTA split.
#pragma once

#include <cstdint>

#include "core/bf16.h"
#include "core/rng.h"

namespace megadecode::cuda {

constexpr int kSampleKeyIdxBits = 23;  // vocabularies up to 8M tokens
constexpr int kSampleDigitBits = 11;
constexpr int kSampleBins = 1 << kSampleDigitBits;
constexpr int kSamplePasses = 5;      // 5 * 11 = 55 = 32 + 23 bits
constexpr int kSampleChunk = 4096;    // vocab entries per CTA in the split passes

__device__ __forceinline__ uint32_t orderable_bits(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ uint64_t sample_key(float logit, int i) {
  return (uint64_t(orderable_bits(logit)) << kSampleKeyIdxBits) | uint64_t((1u << kSampleKeyIdxBits) - 1 - i);
}
// exp((logit - max) / T) in [0, 1] as a 32.32 fixed-point integer: exact, order-free sums.
__device__ __forceinline__ uint64_t sample_mass(float logit, float mx, float inv_t) {
  return static_cast<uint64_t>(expf((logit - mx) * inv_t) * 4294967296.0f);
}
// Standard Gumbel noise for token i; u in (0, 1) strictly.
__device__ __forceinline__ float sample_gumbel(uint64_t seed, int64_t position, int i) {
  const Philox4 r = philox4x32(uint32_t(i), uint32_t(uint64_t(position)), uint32_t(uint64_t(position) >> 32), 0u,
                               uint32_t(seed), uint32_t(seed >> 32));
  const float u = (float(r.v[0] >> 8) + 0.5f) * (1.0f / 16777216.0f);
  return -logf(-logf(u));
}

// (value, index) argmax step: larger value wins, ties to the lower index.
__device__ __forceinline__ void argmax_merge(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

}  // namespace megadecode::cuda
