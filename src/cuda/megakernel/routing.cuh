// The layer's routing, derived by every SM itself from the router logits (no dispatch task): the
// softmax (or sigmoid: MkModelWeights::router_sigmoid) top-k of every token (one warp per token, cuda/common/moe.cuh: ties to the lower expert
// id), then the slot numbering of plan/moe_split.h (expert-major, tokens in order inside an
// expert), all in shared memory. Every SM computes the same tables from the same logits with the
// same code, so they agree bit for bit; the expert shares (plan/moe_split.h) follow from them.
#pragma once

#include <cstdint>

#include "cuda/common/moe.cuh"
#include "cuda/megakernel/sync.cuh"

namespace megadecode::cuda::mk {

constexpr int kMaxBatch = 64;
constexpr int kMaxTopK = 8;
constexpr int kMaxExperts = kRouterMaxExperts;  // 256
static_assert(kMaxExperts <= kConsumerThreads, "one consumer thread per expert");

struct RouteSmem {
  int32_t layer;     // whose routing the tables hold (-1: none yet in this launch)
  int32_t n_active;  // experts with at least one token
  int32_t bad;       // a top-k choice was no expert (non-finite logits)
  int32_t pad;
  int16_t active[kMaxExperts];       // active experts, ascending
  int16_t offset[kMaxExperts + 1];   // first slot of each expert; offset[E] = B * K
  int16_t count[kMaxExperts];        // tokens of each expert
  int16_t slot_token[kMaxBatch * kMaxTopK];
  int8_t slot_k[kMaxBatch * kMaxTopK];  // the slot's rank in its token's top-k
  int32_t ids[kMaxBatch * kMaxTopK];    // [t][k] experts of token t, descending probability
  float w[kMaxBatch * kMaxTopK];        // [t][k] their (renormalised) weights
};

// All 256 consumer threads. Fills `r` for `layer` from the router logits (written by other SMs in
// this launch: ld.global.cg after the caller's acquire) and, on SM 0 with capture on, the routing
// capture. Returns false (uniformly) when a choice was not an expert; the caller reports it.
__device__ __noinline__ bool compute_routing(const MkParams& p, int layer, RouteSmem& r) {
  const PlanShape& s = p.plan.shape;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int B = s.batch, K = s.top_k, E = s.n_experts, n = B * K;
  const float* logits = buf<float>(p, p.plan.buffers.router_logits);
  if (tid == 0) r.bad = 0;
  if (p.w.router_sigmoid != 0) {
    for (int t = warp; t < B; t += kConsumerWarps)
      router_sigmoid_topk_warp(logits + static_cast<int64_t>(t) * E, E, K, p.w.norm_topk != 0, &r.ids[t * K], &r.w[t * K]);
  } else {
    for (int t = warp; t < B; t += kConsumerWarps)
      router_topk_warp(logits + static_cast<int64_t>(t) * E, E, K, p.w.norm_topk != 0, &r.ids[t * K], &r.w[t * K]);
  }
  consumer_sync();
  if (tid < E) {
    int c = 0;
#pragma unroll 1
    for (int i = 0; i < n; ++i) c += r.ids[i] == tid;
    r.count[tid] = static_cast<int16_t>(c);
  }
#pragma unroll 1
  for (int i = tid; i < n; i += kConsumerThreads)
    if (r.ids[i] < 0 || r.ids[i] >= E) r.bad = 1;
  consumer_sync();
  if (warp == 0) {
    // Exclusive prefix sums of counts and of activity over experts: lane l owns experts
    // [8l, 8l + 8) (E <= 256), then a warp scan of the lanes' totals.
    int cnt[kMaxExperts / 32], tot = 0, act = 0;
#pragma unroll
    for (int j = 0; j < kMaxExperts / 32; ++j) {
      const int e = lane * (kMaxExperts / 32) + j;
      cnt[j] = e < E ? r.count[e] : 0;
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
#pragma unroll
    for (int j = 0; j < kMaxExperts / 32; ++j) {
      const int e = lane * (kMaxExperts / 32) + j;
      if (e < E) {
        r.offset[e] = static_cast<int16_t>(tot_before);
        if (cnt[j] > 0) r.active[act_before++] = static_cast<int16_t>(e);
      }
      tot_before += cnt[j];
    }
    if (lane == 31) {
      r.offset[E] = static_cast<int16_t>(tot_before);
      r.n_active = act_before;
    }
  }
  consumer_sync();
  if (tid < E && r.count[tid] > 0) {
    int slot = r.offset[tid], tok = 0, k = 0;  // choice i = tok * K + k
#pragma unroll 1
    for (int i = 0; i < n; ++i) {
      if (r.ids[i] == tid) {
        r.slot_token[slot] = static_cast<int16_t>(tok);
        r.slot_k[slot] = static_cast<int8_t>(k);
        ++slot;
      }
      if (++k == K) {
        k = 0;
        ++tok;
      }
    }
  }
  if (p.route_ids != nullptr && blockIdx.x == 0)  // routing capture (tests): [token][layer][k]
#pragma unroll 1
    for (int i = tid; i < n; i += kConsumerThreads) {
      const int64_t at = (static_cast<int64_t>(i / K) * s.n_layers + layer) * K + i % K;
      p.route_ids[at] = r.ids[i];
      p.route_w[at] = r.w[i];
    }
  if (tid == 0) r.layer = layer;
  consumer_sync();
  return r.bad == 0;
}

}  // namespace megadecode::cuda::mk
