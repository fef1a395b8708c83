// The megakernel's skinny GEMM: one work = a range of 16-row weight blocks over a k range, for up
// to 64 tokens, streamed as pages of (kMT row blocks x kStageK) with the layout of
// cuda/common/skinny_gemm.cuh (GemmTile), so the consumer math is that file's gemm_consume_stage.
// Differences from the standalone tile (why this file exists): the producer issues the WEIGHT part
// of a page before the work's activation wait (mbarrier expect_tx without arrive) and the
// activation part later (arrive.expect_tx); activation rows may be gathered (expert token lists);
// the epilogue is per op (plain fp32 store, or SiLU(gate)*up into bf16 for expert up).
// Determinism: k block kb is accumulated by consumer warp kb % 8 in increasing kb, warp partials
// are summed in warp order: the sum order of an output depends on neither the batch nor the tile.
#pragma once

#include <cstdint>

#include "cuda/common/moe.cuh"
#include "cuda/common/skinny_gemm.cuh"
#include "cuda/megakernel/sync.cuh"
#include "cuda/megakernel/work.h"

namespace megadecode::cuda::mk {

// Producer-side description of one GEMM work.
struct GemmJob {
  const uint16_t* w;  // packed matrix
  int32_t n_kb_total; // k blocks per row block of the matrix (row-block stride)
  int32_t rb_begin, rb_end;
  int32_t kb_off, n_kb;  // k blocks [kb_off, kb_off + n_kb)
  int32_t n_tokens;
  const uint16_t* x;      // bf16 activation rows
  int32_t x_stride;       // elements between rows
  const int32_t* gather;  // row of token i = gather[i] (nullptr: i); written this step: ld.cg
};

template <int kNT>
struct MkTile {
  using T = GemmTile<kNT>;
  static constexpr int kMT = T::kMT;
  static constexpr int kStageK = T::kStageK;
  static constexpr int kStageKB = T::kStageKB;
  static constexpr int kPageBytes = T::kPageBytes;
  static constexpr int kRedBytes = T::kRedBytes;
};

template <int kNT>
__device__ __forceinline__ int job_stages(int n_kb) {
  return (n_kb + MkTile<kNT>::kStageKB - 1) / MkTile<kNT>::kStageKB;
}
template <int kNT>
__device__ __forceinline__ int job_pages(int rb_begin, int rb_end, int n_kb) {
  const int chunks = (rb_end - rb_begin + MkTile<kNT>::kMT - 1) / MkTile<kNT>::kMT;
  return chunks * job_stages<kNT>(n_kb);
}

// Weight part of page `pg` of the job: expect_tx (no arrive) then the bulk copies (evict-first).
template <int kNT>
__device__ __forceinline__ void issue_weights(const GemmJob& j, int pg, uint8_t* page, uint64_t* full,
                                              uint64_t policy) {
  using M = MkTile<kNT>;
  const int n_st = job_stages<kNT>(j.n_kb);
  const int chunk = pg / n_st, stage = pg % n_st;
  const int rb0 = j.rb_begin + chunk * M::kMT;
  const int n_rb = min(M::kMT, j.rb_end - rb0);
  const int kb0 = stage * M::kStageKB;
  const int n_kbs = min(M::kStageKB, j.n_kb - kb0);
  const uint32_t bytes = static_cast<uint32_t>(n_kbs) * kPackTileBytes;
  mbar_expect_tx(full, bytes * n_rb);
  for (int m = 0; m < n_rb; ++m) {
    const uint8_t* src = reinterpret_cast<const uint8_t*>(j.w) +
                         (static_cast<int64_t>(rb0 + m) * j.n_kb_total + j.kb_off + kb0) * kPackTileBytes;
    ptx::bulk_g2s(page + m * M::kStageKB * kPackTileBytes, src, bytes, full, policy);
  }
}

// Activation part of page `pg`: arrive.expect_tx then one bulk copy per token row. The caller has
// acquired the work's counters and executed fence.proxy.async.global since.
template <int kNT>
__device__ __forceinline__ void issue_activations(const GemmJob& j, int pg, uint8_t* page, uint64_t* full) {
  using M = MkTile<kNT>;
  using T = GemmTile<kNT>;
  const int n_st = job_stages<kNT>(j.n_kb);
  const int stage = pg % n_st;
  const int kb0 = stage * M::kStageKB;
  const int n_kbs = min(M::kStageKB, j.n_kb - kb0);
  const uint32_t bytes = static_cast<uint32_t>(n_kbs) * kPackK * 2;
  ptx::mbar_arrive_expect_tx(full, bytes * j.n_tokens);
  for (int t = 0; t < j.n_tokens; ++t) {
    const int row = j.gather ? __ldcg(j.gather + t) : t;
    const uint16_t* src = j.x + static_cast<int64_t>(row) * j.x_stride + (j.kb_off + kb0) * kPackK;
    ptx::bulk_g2s(page + T::kWBytes + t * T::kXPitch, src, bytes, full);
  }
}

// Consumer side of a whole GEMM work: every page in order, then per 16-row block the fixed-order
// reduction and the op's epilogue. `seq` is this CTA's page sequence number (advanced here).
// All 256 consumer threads call it. Returns false when a page never completed (step failed).
template <int kNT, bool kSwiGlu>
__device__ bool consume_gemm(const MkParams& p, const Work& wk, uint8_t* pages, int n_slots, uint64_t* full,
                             uint64_t* empty, float* red, uint32_t& seq) {
  using M = MkTile<kNT>;
  using T = GemmTile<kNT>;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int n_st = job_stages<kNT>(wk.n_kb);
  const int n_chunks = (wk.rb_end - wk.rb_begin + M::kMT - 1) / M::kMT;
  bool ok = true;
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    float acc[M::kMT][kNT][4];
#pragma unroll
    for (int m = 0; m < M::kMT; ++m)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.0f;
    for (int s = 0; s < n_st; ++s, ++seq) {
      const uint32_t slot = seq % n_slots, parity = (seq / n_slots) & 1;
      if (ok) ok = mbar_wait_bounded(p, &full[slot], parity, 100 + slot);
      if (ok) {
        const int n_kbs = min(M::kStageKB, wk.n_kb - s * M::kStageKB);
        gemm_consume_stage<kNT>(acc, pages + slot * M::kPageBytes, n_kbs, warp);
      }
      // Generic reads of the page are ordered before the producer's next bulk copy into it.
      ptx::fence_proxy_async_shared();
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(&empty[slot]);
    }
    if (consumer_any(!ok)) {  // keep releasing pages in order; outputs are abandoned
      ok = false;
      continue;
    }
    const int rb0 = wk.rb_begin + chunk * M::kMT;
#pragma unroll
    for (int m = 0; m < M::kMT; ++m) {
      consumer_sync();  // previous round's readers are done with `red`
      float* mine = red + warp * (8 * kNT * T::kRedPitch);
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const int tok = j * 8 + 2 * t4;
        mine[tok * T::kRedPitch + g] = acc[m][j][0];
        mine[(tok + 1) * T::kRedPitch + g] = acc[m][j][1];
        mine[tok * T::kRedPitch + g + 8] = acc[m][j][2];
        mine[(tok + 1) * T::kRedPitch + g + 8] = acc[m][j][3];
      }
      consumer_sync();
      const int rb = rb0 + m;
      if (rb >= wk.rb_end) continue;  // uniform across threads
      auto sum_at = [&](int tok, int r) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < kConsumerWarps; ++w) s += red[w * (8 * kNT * T::kRedPitch) + tok * T::kRedPitch + r];
        return s;
      };
      if constexpr (kSwiGlu) {
        // Row block rb holds gate columns 8rb..8rb+7 (rows 0..7) and the matching up rows (8..15).
        for (int idx = tid; idx < 8 * 8 * kNT; idx += kConsumerThreads) {
          const int i = idx & 7, tok = idx >> 3;
          const int col = rb * 8 + i;
          if (tok < wk.n_tokens && col < wk.row_end) {
            const float gate = sum_at(tok, i), up = sum_at(tok, i + 8);
            uint16_t* y = static_cast<uint16_t*>(wk.y);
            y[static_cast<int64_t>(wk.y_tok_base + tok) * wk.y_stride + col] = float_to_bf16_bits(silu(gate) * up);
          }
        }
      } else {
        for (int idx = tid; idx < 16 * 8 * kNT; idx += kConsumerThreads) {
          const int r = idx & 15, tok = idx >> 4;
          const int row = rb * 16 + r;
          if (tok < wk.n_tokens && row < wk.row_end) {
            float* y = static_cast<float*>(wk.y);
            y[static_cast<int64_t>(wk.y_tok_base + tok) * wk.y_stride + row] = sum_at(tok, r);
          }
        }
      }
    }
  }
  return ok;
}

}  // namespace megadecode::cuda::mk
