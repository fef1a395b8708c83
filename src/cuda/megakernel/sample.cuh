// SAMPLE on the device, one token row at a time by the 256 consumer threads.
// Semantics (vLLM order, as the host sampler): greedy when temperature < 1e-5 (argmax, ties to the
// lowest id); else temperature, then min-p (exp((l - max)/T) >= min_p), top-k and top-p over the
// tokens in descending-logit order, then a draw among the kept tokens. The kept set is
// {l >= threshold}: top-k and top-p thresholds are found by an exact radix select over the 32-bit
// order-preserving logit key (4 passes of 8 bits; counts and 32.32 fixed-point masses are integers,
// so histogram sums are exact and order-free). Tokens tied with the threshold logit are all kept.
// The draw is Gumbel-max over the kept set: argmax_i l_i/T + g_i, g_i from Philox4x32-10 with
// counter (i, position lo, position hi, 0) and key (seed lo, seed hi), so the same seed and
// position give the same token whatever the batch or the SM.
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "cuda/megakernel/tile_ops.cuh"
#include "sampling/params.h"

namespace megadecode::cuda::mk {

struct SampleScratch {
  uint32_t count[256];
  unsigned long long mass[256];
  float best_v[kConsumerWarps];
  int32_t best_i[kConsumerWarps];
  uint32_t key;     // radix result
  uint32_t above;   // count above the current prefix
  unsigned long long above_mass;
};

__device__ __forceinline__ uint32_t logit_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ void argmax_step(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// Block argmax of f(i) over i < n (ties to the lower index); every consumer gets the result.
template <typename F>
__device__ int consumer_argmax(int n, F f, SampleScratch& sc, float* best_value) {
  float v = -INFINITY;
  int idx = 0x7fffffff;
  for (int i = threadIdx.x; i < n; i += kConsumerThreads) argmax_step(v, idx, f(i), i);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) argmax_step(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
  consumer_sync();
  if ((threadIdx.x & 31) == 0) {
    sc.best_v[threadIdx.x >> 5] = v;
    sc.best_i[threadIdx.x >> 5] = idx;
  }
  consumer_sync();
  v = sc.best_v[0];
  idx = sc.best_i[0];
  for (int w = 1; w < kConsumerWarps; ++w) argmax_step(v, idx, sc.best_v[w], sc.best_i[w]);
  if (best_value) *best_value = v;
  return idx;
}

// The largest key kappa such that (by_mass ? mass : count) of {keep(i) && key(i) > kappa} < goal
// <= the same over key(i) >= kappa, i.e. the key of the element where the descending cumulative
// amount reaches `goal`. Returns 0 (keep everything) when the total never reaches it.
template <typename Keep>
__device__ uint32_t radix_threshold(const float* row, int n, Keep keep, bool by_mass, unsigned long long goal,
                                    float mx, float inv_t, SampleScratch& sc) {
  uint32_t prefix = 0;
  unsigned long long above = 0;
  for (int level = 3; level >= 0; --level) {
    const int shift = level * 8;
    const uint32_t hi_mask = level == 3 ? 0u : (0xffffffffu << (shift + 8));
    consumer_sync();
    sc.count[threadIdx.x] = 0;
    sc.mass[threadIdx.x] = 0;
    consumer_sync();
    for (int i = threadIdx.x; i < n; i += kConsumerThreads) {
      const float l = __ldcg(row + i);
      const uint32_t k = logit_key(l);
      if ((k & hi_mask) != (prefix & hi_mask) || !keep(i, l)) continue;
      const uint32_t bin = (k >> shift) & 255u;
      if (by_mass)
        atomicAdd(&sc.mass[bin], static_cast<unsigned long long>(expf((l - mx) * inv_t) * 4294967296.0f));
      else
        atomicAdd(&sc.count[bin], 1u);
    }
    consumer_sync();
    if (threadIdx.x == 0) {
      int b = 255;
      for (; b >= 0; --b) {
        const unsigned long long amount = by_mass ? sc.mass[b] : sc.count[b];
        if (above + amount >= goal) break;
        above += amount;
      }
      sc.key = b < 0 ? 0xffffffffu : static_cast<uint32_t>(b);
      sc.above_mass = above;
    }
    consumer_sync();
    if (sc.key == 0xffffffffu) return 0;  // never reached: keep everything
    prefix |= sc.key << shift;
    above = sc.above_mass;
  }
  return prefix;
}

// Samples rows [arg0, arg1).
__device__ inline bool op_sample(const MkParams& p, const Work& wk, SampleScratch& sc) {
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const int V = s.vocab;
  for (int t = wk.arg[0]; t < wk.arg[1]; ++t) {
    const float* row = buf<float>(p, b.logits) + static_cast<int64_t>(t) * V;
    const SamplingParams sp = buf<const SamplingParams>(p, b.sampling)[t];
    const int64_t position = buf<int32_t>(p, b.seq_len)[t];
    float mx = 0.0f;
    const int arg = consumer_argmax(V, [&](int i) { return __ldcg(row + i); }, sc, &mx);
    int token = arg;
    if (!(sp.temperature < 1e-5f)) {
      const float inv_t = 1.0f / sp.temperature;
      const float min_p = sp.min_p;
      auto keep_minp = [&](int, float l) { return expf((l - mx) * inv_t) >= min_p; };
      uint32_t kappa = 0;
      if (sp.top_k > 0 && sp.top_k < V)
        kappa = radix_threshold(row, V, keep_minp, false, static_cast<unsigned long long>(sp.top_k), mx, inv_t, sc);
      auto keep_k = [&](int i, float l) { return keep_minp(i, l) && logit_key(l) >= kappa; };
      if (sp.top_p < 1.0f) {
        // Total kept mass, then the threshold where the descending cumulative mass reaches top_p of it.
        unsigned long long total = 0;
        for (int i = threadIdx.x; i < V; i += kConsumerThreads) {
          const float l = __ldcg(row + i);
          if (keep_k(i, l)) total += static_cast<unsigned long long>(expf((l - mx) * inv_t) * 4294967296.0f);
        }
        consumer_sync();
        if (threadIdx.x == 0) sc.above_mass = 0;
        consumer_sync();
        atomicAdd(&sc.above_mass, total);
        consumer_sync();
        total = sc.above_mass;
        const unsigned long long goal =
            static_cast<unsigned long long>(static_cast<double>(sp.top_p) * static_cast<double>(total));
        const uint32_t kp = radix_threshold(row, V, keep_k, true, goal > 0 ? goal : 1, mx, inv_t, sc);
        kappa = kp > kappa ? kp : kappa;
      }
      const uint64_t seed = sp.seed;
      token = consumer_argmax(
          V,
          [&](int i) {
            const float l = __ldcg(row + i);
            if (!keep_minp(i, l) || logit_key(l) < kappa) return -INFINITY;
            const Philox4 r = philox4x32(static_cast<uint32_t>(i), static_cast<uint32_t>(position),
                                         static_cast<uint32_t>(static_cast<uint64_t>(position) >> 32), 0u,
                                         static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
            const float u = (static_cast<float>(r.v[0] >> 8) + 0.5f) * (1.0f / 16777216.0f);
            return l * inv_t - logf(-logf(u));
          },
          sc, nullptr);
      if (token == 0x7fffffff) token = arg;  // nothing kept (cannot happen: the max is kept)
    }
    if (threadIdx.x == 0) buf<int32_t>(p, b.out_tokens)[t] = token;
  }
  return true;
}

}  // namespace megadecode::cuda::mk
