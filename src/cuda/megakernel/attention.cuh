// Parts of the megakernel's tensor-core attention item (the op itself: attention_item.cuh; the
// scalar item in tile_ops.cuh stays the default): its shared scratch, the per-warp cp.async chunk
// loads (zero-fill past the split and at the new token), the patch of the appended row into a
// stage, and the prologue (q/k norm, RoPE, KV append, q split into bf16 MMA terms).
// Index math: attention_geo.h (host-tested).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/megakernel/attention_geo.h"
#include "cuda/megakernel/tile_ops.cuh"

namespace megadecode::cuda::mk {

static_assert(kAttnWarps == kConsumerWarps);

struct AttnTcScratch {
  uint8_t stage[kConsumerWarps][2][kAttnStageBytes];  // per warp: K rows, V rows [16][pitch] bf16
  float q[kAttnMaxGroup][kAttnMaxDim];                // normed, rotated q (fp32)
  float qn[kAttnMaxGroup][kAttnMaxDim];               // normed q before RoPE
  float kn[kAttnMaxDim], vn[kAttnMaxDim];
  uint32_t qfrag[kAttnMaxTerms][kAttnMaxDim / 16][4][32];  // q A fragments [term][k16 chunk][reg][lane]
  uint16_t knew[kAttnMaxDim], vnew[kAttnMaxDim];           // the appended row as stored (bf16)
  int32_t old;
  int32_t pad[3];
};
// The warp merge reuses the stages: [warp][gs][D] o and [warp][gs][2] (m, l).
static_assert(kConsumerWarps * kAttnMaxGroup * (kAttnMaxDim + 2) * 4 <= static_cast<int>(sizeof(AttnTcScratch::stage)));
static_assert(kAttnStageBytes % 16 == 0 && offsetof(AttnTcScratch, knew) % 16 == 0 && offsetof(AttnTcScratch, vnew) % 16 == 0);

// Two floats -> n_terms packed bf16 pairs (term i of x0 in the low half), zero past n_terms.
__device__ __forceinline__ void attn_pack_terms(float x0, float x1, int n_terms, uint32_t* out, int stride) {
  uint16_t a[kAttnMaxTerms], b[kAttnMaxTerms];
  attn_split_terms(x0, n_terms, a);
  attn_split_terms(x1, n_terms, b);
#pragma unroll
  for (int i = 0; i < kAttnMaxTerms; ++i) out[i * stride] = static_cast<uint32_t>(a[i]) | (static_cast<uint32_t>(b[i]) << 16);
}

// One warp: cp.async the K (which = 0) or V (1) rows of chunk c into its stage, zero-filled where
// AttnGeo::copied says so, then commit a group (every lane commits: uniform group counts).
__device__ __forceinline__ void attn_tc_load(const AttnGeo& g, const uint16_t* base, int c, uint8_t* dst, int lane) {
  for (int idx = lane; idx < kAttnRows * (g.D / 8); idx += 32) {
    const AttnPiece pc = attn_piece(idx, g.D);
    const int tok = g.token(c, pc.row);
    const bool copy = g.copied(tok);
    const uint16_t* src = copy ? base + g.at(tok) + pc.ch * 8 : base;
    ptx::cp_async_16(dst + pc.row * kAttnPitch + pc.ch * 16, src, copy ? 16 : 0);
  }
  ptx::cp_async_commit();
}

// After the wait for chunk c's stage: write the appended row into it if the chunk holds it.
__device__ __forceinline__ void attn_tc_patch(const AttnGeo& g, int c, const uint16_t* row_src, uint8_t* dst, int lane) {
  const int r = g.patch_row(c);
  if (r >= 0 && lane < g.D / 8)
    *reinterpret_cast<uint4*>(dst + r * kAttnPitch + lane * 16) = reinterpret_cast<const uint4*>(row_src)[lane];
  __syncwarp();
}

// q/k RMSNorm, RoPE at position n-1, and (appending item) the new K/V row: to the cache and to
// sc.knew/vnew. The same arithmetic as the scalar item (tile_ops.cuh), so the cache is identical.
__device__ inline void attn_tc_prologue(const MkParams& p, const Work& wk, const AttnItem& it, const AttnGeo& geo,
                                        bool appends, uint16_t* kc, uint16_t* vc, AttnTcScratch& sc) {
  const PlanShape& s = p.plan.shape;
  const MkLayerWeights& lw = p.w.layers[wk.layer];
  const int tid = threadIdx.x;
  const int G = s.n_kv_heads, gs = s.group_size, D = s.head_dim, n = geo.new_pos + 1;
  const float* raw = buf<float>(p, p.plan.buffers.qkv) + (static_cast<int64_t>(it.seq) * G + it.group) * (gs + 2) * D;
  attn_qk_norm(p, lw, raw, gs, D, appends, sc);
  consumer_sync();
  attn_rope_append(p, gs, D, n - 1, appends, sc, [&](int d, uint16_t kb, uint16_t vb) {
    const int64_t at = geo.at(n - 1) + d;
    kc[at] = kb;
    vc[at] = vb;
    sc.knew[d] = kb;
    sc.vnew[d] = vb;
  });
  consumer_sync();  // q and the new row are ready
  // q A fragments, n_terms bf16 terms (rows >= gs are zero), in shared memory (lane-consecutive
  // words: conflict-free) to leave registers to the accumulators.
  const int n_terms = p.attn_terms;
  for (int i = tid; i < (D / 16) * 4 * 32; i += kConsumerThreads) {
    const int ln = i % 32, r = (i / 32) % 4, kchunk = i / 128;
    const AttnRC rc = attn_qfrag_coord(ln, r, kchunk);
    const bool use = rc.row < gs;
    attn_pack_terms(use ? sc.q[rc.row][rc.col] : 0.0f, use ? sc.q[rc.row][rc.col + 1] : 0.0f, n_terms,
                    &sc.qfrag[0][kchunk][r][ln], (kAttnMaxDim / 16) * 4 * 32);
  }
  consumer_sync();
}

}  // namespace megadecode::cuda::mk
