// The device sampler: one logits row sampled by the threads of one CTA (the megakernel's 256
// consumers, or a standalone launch), under the contract of sampling/params.h (vLLM's order:
// greedy, temperature, min-p, top-k, top-p, then a draw; ties to the lower token id).
// Tokens are totally ordered by a 55-bit key
//   key(i) = orderable(logit_i) << 23 | (2^23 - 1 - i)
// (larger logit first, ties to the lower id): the canonical order of the host sampler. Every
// filter (min-p, top-k, top-p) keeps a prefix of that order, so the kept set is {i : key(i) >= kappa}
// for one threshold kappa, found by an exact radix select (5 passes of 11 bits; counts and
// probability mass as 64-bit integers, so sums are exact and order-free); top-k keeps exactly k
// tokens. The draw is Gumbel-max over the kept tokens: argmax_i logit_i / T - log(-log(u_i)), u_i
// from Philox4x32-10 with counter (i, position lo, position hi, 0) and key (seed lo, seed hi), so
// the same (seed, position) gives the same token whatever the batch or the CTA.
#pragma once

#include <cstdint>

#include "core/bf16.h"
#include "core/rng.h"
#include "sampling/params.h"
#include "sampling/token_mask.h"

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

// The logit loader of a constrained row (structured output): ld(i), or -inf for a token `mask`
// ([ceil(vocab / 32)] packed words, sampling/token_mask.h) does not allow, so every pass below (the
// argmax, the filters, the draw) sees the disallowed tokens as -inf, as the host sampler does. The
// row must take the sampler's own argmax pass (sample_row), not a max found without the mask.
template <class Load>
__device__ __forceinline__ auto masked_loader(Load ld, const uint32_t* mask) {
  return [=](int i) { return token_mask_allows(mask, i) ? ld(i) : -INFINITY; };
}

// ---- one row by kThreads threads (tid = threadIdx.x < kThreads) that meet at sync() ----

// Shared memory of one row's sampling.
template <int kThreads>
struct RowSampleScratch {
  static_assert(kThreads % 32 == 0 && kSampleBins % kThreads == 0, "threads must divide the histogram");
  uint64_t hist[kSampleBins];      // radix digit -> count or fixed-point mass
  uint64_t warp_total[kThreads / 32];
  uint64_t result[2];
  float best_v[kThreads / 32];
  int32_t best_i[kThreads / 32];
};

// (value, index) argmax over the threads (larger value, ties to the lower index); all get it.
template <int kThreads, class Sync>
__device__ void row_argmax(float& v, int& i, RowSampleScratch<kThreads>& sc, Sync sync) {
  for (int o = 16; o > 0; o >>= 1) argmax_merge(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
  sync();  // the previous call's readers are done with best_v / best_i
  if ((threadIdx.x & 31) == 0) {
    sc.best_v[threadIdx.x >> 5] = v;
    sc.best_i[threadIdx.x >> 5] = i;
  }
  sync();
  v = sc.best_v[0];
  i = sc.best_i[0];
  for (int w = 1; w < kThreads / 32; ++w) argmax_merge(v, i, sc.best_v[w], sc.best_i[w]);
}

// Exclusive prefix sums of kItems values per thread, items in thread order (thread t holds items
// kItems*t ..); ex[j] gets the sum of every item before item j. Integer: exact.
template <int kThreads, int kItems, class Sync>
__device__ void row_exclusive_scan(const uint64_t (&x)[kItems], uint64_t (&ex)[kItems], RowSampleScratch<kThreads>& sc,
                                   Sync sync) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t own = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) own += x[j];
  uint64_t incl = own;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t up = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += up;
  }
  sync();  // the previous call's readers are done with warp_total
  if (lane == 31) sc.warp_total[warp] = incl;
  sync();
  uint64_t run = incl - own;
  for (int w = 0; w < warp; ++w) run += sc.warp_total[w];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    ex[j] = run;
    run += x[j];
  }
}

// The sum of one value per thread; all get it.
template <int kThreads, class Sync>
__device__ uint64_t row_sum(uint64_t x, RowSampleScratch<kThreads>& sc, Sync sync) {
  const uint64_t one[1] = {x};
  uint64_t ex[1];
  row_exclusive_scan<kThreads, 1>(one, ex, sc, sync);
  if (threadIdx.x == kThreads - 1) sc.result[0] = ex[0] + x;
  sync();
  const uint64_t total = sc.result[0];
  sync();
  return total;
}

// The key kappa with measure(keys > kappa) < target <= measure(keys >= kappa) among keys >= lower,
// the measure being the count (use_mass false) or the fixed-point mass. Needs 1 <= target <= the
// measure of all keys >= lower. ld(i) reads logit i.
template <int kThreads, class Load, class Sync>
__device__ uint64_t row_radix_select(Load ld, int vocab, float mx, float inv_t, uint64_t lower, uint64_t target,
                                     bool use_mass, RowSampleScratch<kThreads>& sc, Sync sync) {
  constexpr int kItems = kSampleBins / kThreads;
  uint64_t prefix = 0, above = 0;
  for (int pass = 0; pass < kSamplePasses; ++pass) {
    const int shift = (kSamplePasses - 1 - pass) * kSampleDigitBits;
    for (int b = threadIdx.x; b < kSampleBins; b += kThreads) sc.hist[b] = 0;
    sync();
#pragma unroll 8
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float l = ld(i);
      const uint64_t key = sample_key(l, i);
      if (key < lower) continue;
      if (pass > 0 && (key >> (shift + kSampleDigitBits)) != prefix) continue;
      const int d = static_cast<int>((key >> shift) & (kSampleBins - 1));
      atomicAdd(reinterpret_cast<unsigned long long*>(&sc.hist[d]),
                static_cast<unsigned long long>(use_mass ? sample_mass(l, mx, inv_t) : 1ull));
    }
    sync();
    // Items in descending digit order: item r is digit kSampleBins - 1 - r.
    uint64_t m[kItems], e[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) m[j] = sc.hist[kSampleBins - 1 - (kItems * threadIdx.x + j)];
    row_exclusive_scan<kThreads, kItems>(m, e, sc, sync);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (above + e[j] < target && target <= above + e[j] + m[j]) {  // exactly one item
        sc.result[0] = static_cast<uint64_t>(kSampleBins - 1 - (kItems * threadIdx.x + j));
        sc.result[1] = above + e[j];
      }
    }
    sync();
    prefix = (prefix << kSampleDigitBits) | sc.result[0];
    above = sc.result[1];
    sync();
  }
  return prefix;
}

// The kept set's threshold for a non-greedy row whose max logit is mx: min-p keeps the tokens with
// exp((l - mx) / T) >= min_p, top-k the first k of those, top-p the shortest prefix of the rest
// (renormalised) whose mass reaches top_p (a token is kept while the mass before it is < top_p).
template <int kThreads, class Load, class Sync>
__device__ uint64_t row_keep_threshold(Load ld, int vocab, const SamplingParams& sp, float mx,
                                       RowSampleScratch<kThreads>& sc, Sync sync) {
  const float inv_t = 1.0f / sp.temperature;
  uint64_t n_kept = static_cast<uint64_t>(vocab);
  if (sp.min_p > 0.0f) {
    uint64_t c = 0;
#pragma unroll 8
    for (int i = threadIdx.x; i < vocab; i += kThreads) c += expf((ld(i) - mx) * inv_t) >= sp.min_p ? 1 : 0;
    n_kept = row_sum(c, sc, sync);
  }
  if (sp.top_k > 0 && static_cast<uint64_t>(sp.top_k) < n_kept) n_kept = static_cast<uint64_t>(sp.top_k);
  if (n_kept == 0) n_kept = 1;
  uint64_t kappa =
      n_kept >= static_cast<uint64_t>(vocab) ? 0 : row_radix_select(ld, vocab, mx, inv_t, 0, n_kept, false, sc, sync);
  if (sp.top_p < 1.0f) {
    uint64_t m = 0;
#pragma unroll 8
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float l = ld(i);
      if (sample_key(l, i) >= kappa) m += sample_mass(l, mx, inv_t);
    }
    const uint64_t total = row_sum(m, sc, sync);
    // Kept while the mass before a token is < top_p * total; target = the first mass that stops.
    uint64_t target = static_cast<uint64_t>(ceil(static_cast<double>(sp.top_p) * static_cast<double>(total)));
    if (target == 0) target = 1;
    if (target <= total) kappa = row_radix_select(ld, vocab, mx, inv_t, kappa, target, true, sc, sync);
  }
  return kappa;
}

// The token sampled from logits ld(0..vocab) under sp for `position` (every thread returns it),
// given the row's largest logit mx and its lowest id arg (0x7fffffff when every logit is NaN).
// Greedy rows (and rows of only -inf) take the argmax, ties to the lowest id.
template <int kThreads, class Load, class Sync>
__device__ int32_t sample_row_given_max(Load ld, int vocab, const SamplingParams& sp, int64_t position, float mx,
                                        int arg, RowSampleScratch<kThreads>& sc, Sync sync) {
  if (sp.greedy() || !(mx > -INFINITY)) return arg < vocab ? arg : 0;
  const uint64_t kappa = row_keep_threshold(ld, vocab, sp, mx, sc, sync);
  const float inv_t = 1.0f / sp.temperature;
  float best = -INFINITY;
  int token = 0x7fffffff;
#pragma unroll 4
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float l = ld(i);
    if (sample_key(l, i) < kappa) continue;
    argmax_merge(best, token, l * inv_t + sample_gumbel(sp.seed, position, i), i);
  }
  row_argmax(best, token, sc, sync);
  return token < vocab ? token : arg;  // the kept set holds the max, so never the fallback
}

// The token sampled from logits ld(0..vocab) under sp for `position`: the argmax pass, then
// sample_row_given_max.
template <int kThreads, class Load, class Sync>
__device__ int32_t sample_row(Load ld, int vocab, const SamplingParams& sp, int64_t position,
                              RowSampleScratch<kThreads>& sc, Sync sync) {
  float mx = -INFINITY;
  int arg = 0x7fffffff;
#pragma unroll 8
  for (int i = threadIdx.x; i < vocab; i += kThreads) argmax_merge(mx, arg, ld(i), i);
  row_argmax(mx, arg, sc, sync);
  return sample_row_given_max(ld, vocab, sp, position, mx, arg, sc, sync);
}

}  // namespace megadecode::cuda
