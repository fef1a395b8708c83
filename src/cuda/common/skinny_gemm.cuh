// Skinny GEMM building blocks (decode batch 1..64): Y[B, N] (fp32) = X[B, K] (bf16) * W[N, K]^T.
// Weights are the mma.sync m16n8k16 A operand (16 rows per fragment tile, packed as in
// weight_pack.cuh); tokens are the N operand in groups of 8. A "tile" is kMT row blocks (16 rows
// each) over the whole K, for all tokens; it is streamed as k-stages, each one page of shared
// memory holding the stage's weights (kMT bulk copies) and the stage's X columns (one bulk copy per
// token row, pitch padded by 16 bytes so B-fragment loads are conflict-free).
//
// Roles (usable inside the persistent megakernel and in the standalone kernel, skinny_gemm.cu):
//   loader warp    gemm_issue_stage(): expect_tx on the page's full barrier, then the bulk copies
//                  (weights evict-first). It may run ahead of the activation wait ONLY for the
//                  weight part; the X part needs the activations ready (and, when other CTAs wrote
//                  them with ordinary stores in this launch, fence.proxy.async.global after the
//                  acquire, before issuing).
//   8 consumer warps   gemm_consume_stage() on each page (then release the page), and after a
//                  tile's last stage gemm_reduce_store().
// Determinism and batch invariance: global k block kb is always accumulated by consumer warp
// kb % 8, in increasing kb, and the 8 warp partials are summed in warp order; every k-stage size is
// a multiple of 8 k blocks, so the summation order of Y[b, n] depends on neither the batch size nor
// the tile shape. No float atomics.
#pragma once

#include <cstdint>

#include "cuda/common/gemm_args.h"
#include "cuda/common/packed_mma.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/weight_pack.cuh"

namespace megadecode::cuda {

constexpr int kGemmConsumerWarps = 8;
constexpr int kGemmThreads = (kGemmConsumerWarps + 1) * 32;  // + one loader warp
constexpr int kGemmMaxTokens = 64;

// Tile shape for kNT token groups (tokens <= 8 * kNT). Larger batches take taller tiles so each
// X byte pulled from L2 serves more weight rows; the stage stays 16 KB of weights.
template <int kNT>
struct GemmTile {
  static_assert(kNT >= 1 && kNT <= 8);
  static constexpr int kMT = kNT <= 1 ? 1 : (kNT <= 4 ? 2 : 4);       // row blocks per tile
  static constexpr int kStageK = kNT <= 1 ? 512 : (kNT <= 4 ? 256 : 128);  // k per stage
  static constexpr int kStageKB = kStageK / kPackK;                  // k blocks per stage (multiple of 8)
  static constexpr int kWBytes = kMT * kStageKB * kPackTileBytes;    // weight part of a page
  static constexpr int kXPitch = kStageK * 2 + 16;                   // bytes per token row (+16: no conflicts)
  static constexpr int kXBytes = 8 * kNT * kXPitch;
  static constexpr int kPageBytes = (kWBytes + kXBytes + 127) / 128 * 128;
  static constexpr int kRedPitch = 16 + 1;                           // floats per token row in the reduction
  static constexpr int kRedBytes = kGemmConsumerWarps * 8 * kNT * kRedPitch * 4;
  static_assert(kStageKB % kGemmConsumerWarps == 0, "k-to-warp assignment must not depend on the tile");
};

MD_HOST_DEVICE inline int gemm_n_tiles(int n_rows, int mt) { return static_cast<int>((pack_row_blocks(n_rows) + mt - 1) / mt); }
MD_HOST_DEVICE inline int gemm_n_stages(int k, int stage_k) { return (k + stage_k - 1) / stage_k; }

// Loader side: issue the copies of (tile, stage) into `page`, completing on `full_bar`.
// Called by all 32 lanes of one warp. Weight rows past N and tokens past n_tokens are not copied
// (their page bytes are stale; they only reach output rows/columns that are never stored).
template <int kNT>
__device__ __forceinline__ void gemm_issue_stage(const SkinnyGemmArgs& a, int tile, int stage, uint8_t* page,
                                                 uint64_t* full_bar, uint64_t weight_policy) {
  using T = GemmTile<kNT>;
  const int lane = threadIdx.x & 31;
  const int n_kb = static_cast<int>(pack_k_blocks(a.k));
  const int n_rb = static_cast<int>(pack_row_blocks(a.n_rows));
  const int kb0 = stage * T::kStageKB;
  const int n_kb_stage = min(T::kStageKB, n_kb - kb0);
  const int rb0 = tile * T::kMT;
  const int n_rb_tile = min(T::kMT, n_rb - rb0);
  const uint32_t w_bytes = static_cast<uint32_t>(n_kb_stage) * kPackTileBytes;
  const uint32_t x_bytes = static_cast<uint32_t>(n_kb_stage) * kPackK * 2;
  if (lane == 0) ptx::mbar_arrive_expect_tx(full_bar, w_bytes * n_rb_tile + x_bytes * a.n_tokens);
  __syncwarp();
  // 'expect_tx' precedes every copy of this phase, so the phase cannot complete early.
  if (lane < n_rb_tile) {
    const uint8_t* src = reinterpret_cast<const uint8_t*>(a.w_packed) +
                         (static_cast<int64_t>(rb0 + lane) * n_kb + kb0) * kPackTileBytes;
    ptx::bulk_g2s(page + lane * T::kStageKB * kPackTileBytes, src, w_bytes, full_bar, weight_policy);
  }
  for (int tok = lane; tok < a.n_tokens; tok += 32) {
    const uint16_t* src = a.x + static_cast<int64_t>(tok) * a.x_stride + kb0 * kPackK;
    ptx::bulk_g2s(page + T::kWBytes + tok * T::kXPitch, src, x_bytes, full_bar);
  }
}

// Consumer side: accumulate one page into this warp's acc[row block][token group][4].
template <int kNT>
__device__ __forceinline__ void gemm_consume_stage(float (&acc)[GemmTile<kNT>::kMT][kNT][4], const uint8_t* page,
                                                   int n_kb_stage, int warp) {
  using T = GemmTile<kNT>;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const uint8_t* xrow = page + T::kWBytes + g * T::kXPitch + t * 4;
#pragma unroll 1
  for (int kb = warp; kb < n_kb_stage; kb += kGemmConsumerWarps) {
    uint32_t b0[kNT], b1[kNT];
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const uint8_t* p = xrow + j * 8 * T::kXPitch + kb * 32;
      b0[j] = *reinterpret_cast<const uint32_t*>(p);
      b1[j] = *reinterpret_cast<const uint32_t*>(p + 16);
    }
    packed_mma_k16<T::kMT, kNT>(acc, [&](int m) { return page + (m * T::kStageKB + kb) * kPackTileBytes; }, b0, b1);
  }
}

__device__ __forceinline__ void named_barrier_sync(int id, int n_threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n_threads) : "memory");
}

// Consumer side, after a tile's last stage: sums the 8 warps' partials in warp order through
// `red` (GemmTile::kRedBytes of shared memory) and stores Y rows of the tile. All 8 consumer warps
// call it; they synchronise on named barrier `bar_id` (256 threads), never with the loader.
template <int kNT>
__device__ __forceinline__ void gemm_reduce_store(const float (&acc)[GemmTile<kNT>::kMT][kNT][4], float* red,
                                                  const SkinnyGemmArgs& a, int tile, int warp, int bar_id) {
  using T = GemmTile<kNT>;
  constexpr int kConsumers = kGemmConsumerWarps * 32;
  const int lane = threadIdx.x & 31;
  const int ctid = warp * 32 + lane;
#pragma unroll
  for (int m = 0; m < T::kMT; ++m) {
    named_barrier_sync(bar_id, kConsumers);  // the previous round's readers are done with `red`
    store_partial<kNT>(acc[m], red + warp * (8 * kNT * T::kRedPitch), T::kRedPitch);
    named_barrier_sync(bar_id, kConsumers);
    const int row0 = (tile * T::kMT + m) * kPackRows;
    for (int idx = ctid; idx < 16 * 8 * kNT; idx += kConsumers) {
      const int r = idx & 15, tok = idx >> 4;
      const float s = sum_partials<kGemmConsumerWarps>(red, 8 * kNT * T::kRedPitch, tok * T::kRedPitch + r);
      if (tok < a.n_tokens && row0 + r < a.n_rows) a.y[static_cast<int64_t>(tok) * a.y_stride + row0 + r] = s;
    }
  }
}

}  // namespace megadecode::cuda
