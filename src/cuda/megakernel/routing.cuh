// The layer's routing, derived by every SM itself from the router logits (no dispatch task), by the
// SM's loader warp: the softmax (or sigmoid: MkModelWeights::router_sigmoid) top-k of every token
// (cuda/common/moe.cuh: ties to the lower expert id), then the slot numbering of plan/moe_split.h
// (expert-major, tokens in order inside an expert), all in shared memory. Every SM computes the
// same tables from the same logits with the same code, so they agree bit for bit; the expert
// shares (plan/moe_split.h) follow from them.
#pragma once

#include <cstdint>

#include "cuda/common/moe.cuh"
#include "cuda/megakernel/sync.cuh"

namespace megadecode::cuda::mk {

constexpr int kMaxBatch = 64;
constexpr int kMaxTopK = 8;
constexpr int kMaxExperts = kRouterMaxExperts;  // 256
static_assert(kMaxExperts == 8 * 32, "compute_routing: 8 experts per lane of one warp");

struct RouteSmem {
  int32_t n_active;  // experts with at least one token
  // The consumers' side (the loader never touches it): the layer whose routing they took last (-1:
  // none) and how many they took (route_bar phases). Consumer thread 0 writes them before the
  // consumers' next barrier.
  int32_t taken_layer;
  uint32_t taken;
  int32_t pad;
  int16_t active[kMaxExperts];       // active experts, ascending
  int16_t offset[kMaxExperts + 1];   // first slot of each expert; offset[E] = B * K
  int16_t count[kMaxExperts];        // tokens of each expert
  int16_t slot_token[kMaxBatch * kMaxTopK];
  int8_t slot_k[kMaxBatch * kMaxTopK];  // the slot's rank in its token's top-k
  int32_t ids[kMaxBatch * kMaxTopK];    // [t][k] experts of token t, descending probability
  float w[kMaxBatch * kMaxTopK];        // [t][k] their (renormalised) weights
};

// One warp, the loader's (megakernel.cuh): fills `r` for `layer` from the router logits (written by
// other SMs in this launch, read after lane 0's acquire of the router tiles' counter and a warp
// barrier) and, on SM 0 with capture on, the routing capture. Lane l owns experts [8l, 8l + 8)
// (E <= 256) for the counts, the scan and the slots. Returns false (uniformly) when a choice was
// not an expert; the caller reports it. The loader runs it when its walk reaches the layer's
// first routed task, so an SM busy with attention gets its expert pages streaming meanwhile.
__device__ __noinline__ bool compute_routing(const MkParams& p, int layer, RouteSmem& r) {
  constexpr int kPer = kMaxExperts / 32;
  const PlanShape& s = p.plan.shape;
  const int lane = threadIdx.x & 31;
  const int B = s.batch, K = s.top_k, E = s.n_experts, n = B * K;
  const float* logits = buf<float>(p, p.plan.buffers.router_logits);
#pragma unroll 1
  for (int t = 0; t < B; ++t) {
    if (p.w.router_sigmoid != 0)
      router_sigmoid_topk_warp(logits + static_cast<int64_t>(t) * E, E, K, p.w.norm_topk != 0, &r.ids[t * K], &r.w[t * K]);
    else
      router_topk_warp(logits + static_cast<int64_t>(t) * E, E, K, p.w.norm_topk != 0, &r.ids[t * K], &r.w[t * K]);
  }
  __syncwarp();
  // Counts of this lane's experts, and whether any choice is no expert.
  int cnt[kPer] = {};
  bool bad = false;
#pragma unroll 1
  for (int i = 0; i < n; ++i) {
    const int e = r.ids[i];
    bad |= e < 0 || e >= E;
#pragma unroll
    for (int j = 0; j < kPer; ++j) cnt[j] += e == lane * kPer + j;
  }
  bad = __any_sync(0xffffffffu, bad);
  // Exclusive prefix sums of counts and of activity over experts: the lanes' totals by a warp scan.
  int tot = 0, act = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    tot += cnt[j];
    act += cnt[j] > 0;
  }
  int tot_before = tot, act_before = act;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, tot_before, o), b = __shfl_up_sync(0xffffffffu, act_before, o);
    if (lane >= o) {
      tot_before += a;
      act_before += b;
    }
  }
  tot_before -= tot;  // exclusive
  act_before -= act;
  int next[kPer];  // the next slot of each of this lane's experts
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = lane * kPer + j;
    next[j] = tot_before;
    if (e < E) {
      r.offset[e] = static_cast<int16_t>(tot_before);
      r.count[e] = static_cast<int16_t>(cnt[j]);
      if (cnt[j] > 0) r.active[act_before++] = static_cast<int16_t>(e);
    }
    tot_before += cnt[j];
  }
  if (lane == 31) {
    r.offset[E] = static_cast<int16_t>(tot_before);
    r.n_active = act_before;
  }
  // Slots: each expert's choices in (token, k) order, expert-major (plan/moe_split.h).
  {
    int tok = 0, k = 0;  // choice i = tok * K + k
#pragma unroll 1
    for (int i = 0; i < n; ++i) {
      const int e = r.ids[i];
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        if (e == lane * kPer + j) {
          r.slot_token[next[j]] = static_cast<int16_t>(tok);
          r.slot_k[next[j]] = static_cast<int8_t>(k);
          ++next[j];
        }
      if (++k == K) {
        k = 0;
        ++tok;
      }
    }
  }
  if (p.route_ids != nullptr && blockIdx.x == 0)  // routing capture (tests): [token][layer][k]
#pragma unroll 1
    for (int i = lane; i < n; i += 32) {
      const int64_t at = (static_cast<int64_t>(i / K) * s.n_layers + layer) * K + i % K;
      p.route_ids[at] = r.ids[i];
      p.route_w[at] = r.w[i];
    }
  __syncwarp();
  return !bad;
}

}  // namespace megadecode::cuda::mk
