// MoE device building blocks: router top-k (one warp per token; softmax or sigmoid routing),
// SiLU(gate)*up, and the deterministic combine of the k expert outputs plus the residual.
#pragma once

#include <cstdint>

#include "core/bf16.h"
#include "cuda/common/warp.cuh"

namespace megadecode::cuda {

constexpr int kRouterMaxExperts = 256;  // 8 per lane
constexpr int kRouterMaxTopK = 32;

// A float as an unsigned key in the same order (-0 and +0 one key: they compare equal as floats).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Every lane's (best, best_e) becomes the warp's: the largest value, then the lowest index among
// the lanes holding it (the order of a butterfly of "ob > best || (ob == best && oe < best_e)",
// in two warp reductions). No lane holds a NaN.
__device__ __forceinline__ void warp_best(float& best, int& best_e) {
  const uint32_t key = order_key(best);
  const uint32_t top = __reduce_max_sync(0xffffffffu, key);
  best_e = static_cast<int>(__reduce_min_sync(0xffffffffu, key == top ? static_cast<uint32_t>(best_e) : 0xffffffffu));
  best = key_value(top);
}

// One warp: the top_k largest of its values (lane l holds v[j] of expert l + 32 j) in descending
// order, ties to the lower expert index; each pick is replaced by `gone`, which no value that may be
// picked equals or undercuts. Lane r < top_k gets the r-th pick (my_val, my_id); an id of 0x7fffffff
// where fewer than top_k values beat `gone`.
template <int kPer>
__device__ __forceinline__ void warp_topk(float (&v)[kPer], int top_k, float gone, float& my_val, int& my_id) {
  const int lane = threadIdx.x & 31;
  my_val = 0.0f;
  my_id = 0;
  for (int r = 0; r < top_k; ++r) {
    // This lane's best (largest value, then lowest index; own indices increase with j).
    float best = gone;
    int best_e = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      if (v[j] > best) {
        best = v[j];
        best_e = lane + 32 * j;
      }
    warp_best(best, best_e);
    if ((best_e & 31) == lane) {
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        if (lane + 32 * j == best_e) v[j] = gone;
    }
    if (lane == r) {
      my_val = best;
      my_id = best_e;
    }
  }
}

// One warp: lane r < top_k writes the r-th pick, ids[r] = my_id and weights[r] = my_w, divided by
// the picks' sum (in top-k order, identical in every lane) when renormalize.
__device__ __forceinline__ void write_picks(float my_w, int my_id, int top_k, bool renormalize, int32_t* ids,
                                            float* weights) {
  const int lane = threadIdx.x & 31;
  float picked_sum = 0.0f;
  for (int r = 0; r < top_k; ++r) picked_sum += __shfl_sync(0xffffffffu, my_w, r);
  if (lane < top_k) {
    ids[lane] = my_id;
    weights[lane] = renormalize ? my_w / picked_sum : my_w;
  }
}

// One warp: softmax over logits[0..n_experts) in fp32, the top_k largest probabilities (ties to the
// lower expert index) in descending order, optionally renormalised (sum in top-k order).
// Lanes 0..top_k-1 write ids[0..top_k) and weights[0..top_k).
__device__ inline void router_topk_warp(const float* logits, int n_experts, int top_k, bool renormalize, int32_t* ids,
                                        float* weights) {
  constexpr int kPer = kRouterMaxExperts / 32;
  const int lane = threadIdx.x & 31;
  float v[kPer];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < n_experts ? logits[e] : -INFINITY;
    mx = fmaxf(mx, v[j]);
  }
  mx = warp_max(mx);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    v[j] = (lane + 32 * j) < n_experts ? expf(v[j] - mx) : -1.0f;  // -1: never selected
    sum += v[j] > 0.0f ? v[j] : 0.0f;
  }
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (v[j] >= 0.0f) v[j] *= inv;
  float my_pick;  // lane r keeps the r-th pick (top_k <= 32)
  int my_id;
  warp_topk(v, top_k, -2.0f, my_pick, my_id);
  write_picks(my_pick, my_id, top_k, renormalize, ids, weights);
}

// One warp: sigmoid routing (RouterKind::kSigmoidTopK). The top_k largest logits (ties to the lower
// expert index) in descending order: the sigmoid is monotone, so this is the ranking of the
// probabilities without computing them all. Weights sigmoid(logit), optionally renormalised by their
// sum in top-k order. A NaN logit anywhere in the row makes every id -1 (the callers' "no expert"
// check reports it), as a NaN does to the softmax routine's choice; so does a -inf logit the top-k
// would need (never picked: the routine then has no expert for that rank).
// Lanes 0..top_k-1 write ids[0..top_k) and weights[0..top_k).
__device__ inline void router_sigmoid_topk_warp(const float* logits, int n_experts, int top_k, bool renormalize,
                                                int32_t* ids, float* weights) {
  constexpr int kPer = kRouterMaxExperts / 32;
  const int lane = threadIdx.x & 31;
  float v[kPer];
  bool nan = false;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < n_experts ? logits[e] : -INFINITY;  // -inf: never selected
    nan |= v[j] != v[j];
  }
  nan = __any_sync(0xffffffffu, nan);
  float my_logit;  // lane r keeps the r-th pick (top_k <= 32)
  int my_id;
  warp_topk(v, top_k, -INFINITY, my_logit, my_id);
  write_picks(1.0f / (1.0f + expf(-my_logit)), nan ? -1 : my_id, top_k, renormalize, ids, weights);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

}  // namespace megadecode::cuda
