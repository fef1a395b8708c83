// Per-expert token lists of a prefill chunk or a decode batch, built on the device (no host sync):
// (1) one CTA per expert ranks the routed entries (token, k) that chose it, in entry order (each
// warp a consecutive range of entries, 32 a step by ballot, then a scan of the warps' counts); (2) one CTA
// turns the counts into offsets and the grouped GEMMs' tile list by a scan over the experts (the
// list gemm_plan.h build_moe_tiles defines); (3) a thread per entry gives it its slot; (4) optionally,
// one CTA per token copies its activation row to each of its slots. Slots are in (expert, token,
// k) order, the decode megakernel's DISPATCH order, so the combine's inputs are the same rows in
// the same order. Integer work only; the result does not depend on scheduling.
#include <cstdint>

#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/moe.cuh"
#include "cuda/prefill/prefill_kernels.h"

namespace megadecode::cuda::prefill {
namespace {

constexpr int kRankThreads = 1024;
constexpr int kScatterThreads = 1024;

// Entry i = (token, k) takes a slot unless its row is padding. The lists' inputs (topk_ids,
// positions, rank, offsets) are read-only in the kernels that read them, so they are read through
// the read-only path: a plain load may not move above an earlier store the compiler cannot prove
// apart, which cost a memory round trip per entry (the 8192-token piece's lists took 190 us).
__device__ __forceinline__ bool routed(const MoeListArgs& a, int i) {
  return a.positions == nullptr || __ldg(a.positions + i / a.top_k) >= 0;
}

// Warp w owns the consecutive entries [begin, end) and walks them 32 at a time, one coalesced load
// a step, kRankUnroll steps' loads in flight together: a match's rank within the warp is the
// popcount of the ballot below its lane. The warps' totals are scanned in shared memory. (A thread
// a range, entry after entry, waited an L2 round trip per entry: 64 of them twice at 8192 tokens.)
constexpr int kRankWarps = kRankThreads / 32;
constexpr int kRankUnroll = 8;
__global__ void __launch_bounds__(kRankThreads) rank_kernel(const MoeListArgs a) {
  __shared__ int32_t warp_total[kRankWarps];
  const int e = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = a.n_tokens * a.top_k;
  const int per = (n + kRankThreads - 1) / kRankThreads * 32;  // a multiple of 32
  const int begin = min(warp * per, n), end = min(begin + per, n);
  const uint32_t below = (1u << lane) - 1u;
  // The entry's expert, or kSkip past the range or for a padding row.
  constexpr int32_t kSkip = INT32_MIN;
  const auto id_of = [&](int i) { return i < end && routed(a, i) ? __ldg(a.topk_ids + i) : kSkip; };
  int count = 0;
  for (int s = begin; s < end; s += 32 * kRankUnroll) {
    int32_t id[kRankUnroll];
#pragma unroll
    for (int u = 0; u < kRankUnroll; ++u) id[u] = id_of(s + 32 * u + lane);
#pragma unroll
    for (int u = 0; u < kRankUnroll; ++u) {
      if (e == 0 && id[u] != kSkip && (id[u] < 0 || id[u] >= a.n_experts)) atomicCAS(a.error, 0, 1);
      count += __popc(__ballot_sync(0xffffffffu, id[u] == e));
    }
  }
  if (lane == 0) warp_total[warp] = count;
  __syncthreads();
  int before = 0;
  for (int w = 0; w < warp; ++w) before += warp_total[w];
  for (int s = begin; s < end; s += 32 * kRankUnroll) {
    int32_t id[kRankUnroll];
#pragma unroll
    for (int u = 0; u < kRankUnroll; ++u) id[u] = id_of(s + 32 * u + lane);
#pragma unroll
    for (int u = 0; u < kRankUnroll; ++u) {
      const uint32_t m = __ballot_sync(0xffffffffu, id[u] == e);
      if (id[u] == e) a.rank[s + 32 * u + lane] = before + __popc(m & below);
      before += __popc(m);
    }
  }
  if (warp == kRankWarps - 1 && lane == 0) a.counts[e] = before;  // the last range ends after every match
}

// Offsets and tile list by a block-wide scan over the experts (thread e < E owns expert e): the
// same list gemm::build_moe_tiles makes (the CPU tests' reference), without one thread walking
// every expert. Over capacity: error 2 and no tiles.
__global__ void __launch_bounds__(kScatterThreads) scatter_kernel(const MoeListArgs a) {
  __shared__ int32_t offsets[kRouterMaxExperts + 1];
  __shared__ int32_t scan_c[2][kRouterMaxExperts], scan_t[2][kRouterMaxExperts];
  const int e = threadIdx.x, E = a.n_experts, T = a.tile_tokens;
  const int c = e < E ? a.counts[e] : 0, nt = (c + T - 1) / T;
  if (e < kRouterMaxExperts) {
    scan_c[0][e] = c;  // inclusive Hillis-Steele scans of counts and tiles
    scan_t[0][e] = nt;
  }
  __syncthreads();
  int buf = 0;
  for (int d = 1; d < kRouterMaxExperts; d *= 2) {
    if (e < kRouterMaxExperts) {
      scan_c[buf ^ 1][e] = scan_c[buf][e] + (e >= d ? scan_c[buf][e - d] : 0);
      scan_t[buf ^ 1][e] = scan_t[buf][e] + (e >= d ? scan_t[buf][e - d] : 0);
    }
    buf ^= 1;
    __syncthreads();
  }
  const int total_tiles = scan_t[buf][E - 1];
  const bool over = total_tiles > a.tile_capacity;
  if (e < E) {
    const int off = scan_c[buf][e] - c, first = scan_t[buf][e] - nt;
    offsets[e] = off;
    if (!over)
      for (int t = 0; t < nt; ++t) a.tiles[first + t] = gemm::MoeTile{e, off + t * T, min(T, c - t * T), 0};
  }
  if (e == 0) {
    offsets[E] = scan_c[buf][E - 1];
    if (over) atomicCAS(a.error, 0, 2);
    *a.n_tiles = over ? 0 : total_tiles;
  }
  __syncthreads();
  for (int x = threadIdx.x; x <= a.n_experts; x += kScatterThreads) a.offsets[x] = offsets[x];
}

// Every entry's slot, offsets[expert] + rank, one thread per entry over the whole GPU.
constexpr int kSlotThreads = 256;
__global__ void __launch_bounds__(kSlotThreads) token_slot_kernel(const MoeListArgs a) {
  const int i = blockIdx.x * kSlotThreads + threadIdx.x;
  if (i >= a.n_tokens * a.top_k) return;
  const int32_t id = routed(a, i) ? __ldg(a.topk_ids + i) : -1;
  // Padding, or an id rank_kernel reported: slot 0 keeps the combine's reads in bounds.
  a.token_slot[i] = id < 0 || id >= a.n_experts ? 0 : __ldg(a.offsets + id) + __ldg(a.rank + i);
}

// One CTA per token: its row, read once as 16-byte pieces, written to each of its slots.
constexpr int kSlotRowThreads = 128;
__global__ void __launch_bounds__(kSlotRowThreads) slot_rows_kernel(const MoeListArgs a) {
  __shared__ int32_t slot[kRouterMaxTopK];  // the token's slots, read once
  const int t = blockIdx.x;
  if (!routed(a, t * a.top_k)) return;
  if (threadIdx.x < a.top_k) slot[threadIdx.x] = __ldg(a.token_slot + t * a.top_k + threadIdx.x);
  __syncthreads();
  const uint4* src = reinterpret_cast<const uint4*>(a.x + static_cast<int64_t>(t) * a.x_stride);
  const int n16 = a.row_elems / 8;
  // Two pieces' loads go before their stores (a load after a store the compiler cannot prove apart
  // would wait for it).
  for (int c = threadIdx.x; c < n16; c += 2 * kSlotRowThreads) {
    const bool second = c + kSlotRowThreads < n16;
    const uint4 v0 = __ldg(src + c), v1 = second ? __ldg(src + c + kSlotRowThreads) : make_uint4(0, 0, 0, 0);
    for (int k = 0; k < a.top_k; ++k) {
      uint4* dst = reinterpret_cast<uint4*>(a.x_slots + static_cast<int64_t>(slot[k]) * a.x_slots_stride);
      dst[c] = v0;
      if (second) dst[c + kSlotRowThreads] = v1;
    }
  }
}

}  // namespace

void moe_lists(const MoeListArgs& a, cudaStream_t stream) {
  MD_REQUIRE(a.n_experts >= 1 && a.n_experts <= kRouterMaxExperts, "prefill moe: ", a.n_experts, " experts outside 1..",
             kRouterMaxExperts);
  MD_REQUIRE(a.top_k >= 1 && a.top_k <= a.n_experts && a.top_k <= kRouterMaxTopK, "prefill moe: top_k ", a.top_k,
             " outside 1..min(experts, ", kRouterMaxTopK, ")");
  MD_REQUIRE(a.topk_ids && a.rank && a.counts && a.offsets && a.token_slot && a.tiles && a.n_tiles &&
                 a.error,
             "prefill moe: null pointer");
  MD_REQUIRE(a.tile_tokens >= 8 && a.tile_tokens <= 128 && a.tile_tokens % 8 == 0, "prefill moe: tile_tokens ",
             a.tile_tokens, " outside 8..128 or not a multiple of 8");
  MD_REQUIRE(a.tile_capacity >= gemm::moe_tile_capacity(a.n_tokens * a.top_k, a.n_experts, a.tile_tokens),
             "prefill moe: tile capacity ", a.tile_capacity, " below the bound");
  if (a.x != nullptr)
    MD_REQUIRE(a.x_slots != nullptr && a.row_elems > 0 && a.row_elems % 8 == 0 && a.x_stride % 8 == 0 &&
                   a.x_slots_stride % 8 == 0 && a.x_stride >= a.row_elems && a.x_slots_stride >= a.row_elems &&
                   reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.x_slots) % 16 == 0,
               "prefill moe: slot rows need a destination, rows of a positive multiple of 8 elements and 16-byte "
               "aligned rows (row ", a.row_elems, ", strides ", a.x_stride, " / ", a.x_slots_stride, ")");
  if (a.n_tokens <= 0) return;
  rank_kernel<<<a.n_experts, kRankThreads, 0, stream>>>(a);
  CUDA_CHECK_LAST();
  scatter_kernel<<<1, kScatterThreads, 0, stream>>>(a);
  CUDA_CHECK_LAST();
  token_slot_kernel<<<(a.n_tokens * a.top_k + kSlotThreads - 1) / kSlotThreads, kSlotThreads, 0, stream>>>(a);
  CUDA_CHECK_LAST();
  if (a.x != nullptr) {
    slot_rows_kernel<<<a.n_tokens, kSlotRowThreads, 0, stream>>>(a);
    CUDA_CHECK_LAST();
  }
}

}  // namespace megadecode::cuda::prefill
