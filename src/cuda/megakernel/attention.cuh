// Parts of the megakernel's attention item (the op itself: attention_item.cuh): its shared scratch,
// the per-warp cp.async chunk loads (zero-fill past the split and at the new token), the patch of
// the appended row into a stage, the prologue (q/k RMSNorm, RoPE, K/V append, q split into bf16 MMA
// terms), the split's publish and last-arriver election, and the parallel merge of the splits.
// Index math: attention_geo.h (host-tested); the merge arithmetic: cuda/common/attention_state.cuh.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/common/qk_norm_rope.cuh"
#include "cuda/common/rms_norm.cuh"
#include "cuda/megakernel/attention_geo.h"
#include "cuda/megakernel/sync.cuh"

namespace megadecode::cuda::mk {

static_assert(kAttnWarps == kConsumerWarps);

struct AttnScratch {
  uint8_t stage[kConsumerWarps][2][kAttnStageBytes];  // per warp: K rows, V rows [16][pitch] bf16
  float q[kAttnMaxGroup][kAttnMaxDim];                // normed, rotated q (fp32)
  float qn[kAttnMaxGroup][kAttnMaxDim];               // normed q before RoPE
  float kn[kAttnMaxDim], vn[kAttnMaxDim];
  uint32_t qfrag[kAttnTerms][kAttnMaxDim / 16][4][32];  // q A fragments [term][k16 chunk][reg][lane]
  uint16_t knew[kAttnMaxDim], vnew[kAttnMaxDim];        // the appended row as stored (bf16)
  int32_t old;
  int32_t pad[3];
};
// The warp merge reuses the stages: [warp][gs][D] o and [warp][gs][2] (m, l).
static_assert(kConsumerWarps * kAttnMaxGroup * (kAttnMaxDim + 2) * 4 <= static_cast<int>(sizeof(AttnScratch::stage)));
static_assert(kAttnStageBytes % 16 == 0 && offsetof(AttnScratch, knew) % 16 == 0 && offsetof(AttnScratch, vnew) % 16 == 0);

// Splits the last arriver's merge can hold: its (m, l) and weights in the item's scratch.
constexpr int kAttnMergeMaxSplits = 256;

// An attention item the kernel can run (a sequence and group of the batch, a non-empty key range,
// a split count the merge holds): the consumers report one that is not, the loader skips it.
__device__ __forceinline__ bool attn_item_in_range(const PlanShape& s, const AttnItem& it) {
  return it.seq >= 0 && it.seq < s.batch && it.group >= 0 && it.group < s.n_kv_heads && it.pos_begin >= 0 &&
         it.pos_begin < it.pos_end && it.n_splits <= kAttnMergeMaxSplits;
}

// Two floats -> kAttnTerms packed bf16 pairs (term i of x0 in the low half).
__device__ __forceinline__ void attn_pack_terms(float x0, float x1, uint32_t* out, int stride) {
  uint16_t a[kAttnMaxTerms], b[kAttnMaxTerms];
  attn_split_terms(x0, kAttnTerms, a);
  attn_split_terms(x1, kAttnTerms, b);
#pragma unroll
  for (int i = 0; i < kAttnTerms; ++i) out[i * stride] = static_cast<uint32_t>(a[i]) | (static_cast<uint32_t>(b[i]) << 16);
}

// One warp: cp.async the K (or V) rows of chunk c into its stage, zero-filled where
// AttnGeo::copied says so, then commit a group (every lane commits: uniform group counts). Lane l
// copies the pieces attn_lane_pieces(l) names.
__device__ __forceinline__ void attn_load(const AttnGeo& g, const uint16_t* base, int c, uint8_t* dst, int lane) {
  const AttnLanePieces lp = attn_lane_pieces(lane, g.D);
#pragma unroll 2
  for (int row = lp.row0; row < kAttnRows; row += lp.step) {
    const int tok = g.token(c, row);
    const bool copy = g.copied(tok);
    const uint16_t* src = copy ? base + g.at(tok) + lp.ch * 8 : base;
    ptx::cp_async_16(dst + row * kAttnPitch + lp.ch * 16, src, copy ? 16 : 0);
  }
  ptx::cp_async_commit();
}

// After the wait for chunk c's stage: write the appended row into it if the chunk holds it.
__device__ __forceinline__ void attn_patch(const AttnGeo& g, int c, const uint16_t* row_src, uint8_t* dst, int lane) {
  const int r = g.patch_row(c);
  if (r >= 0 && lane < g.D / 8)
    *reinterpret_cast<uint4*>(dst + r * kAttnPitch + lane * 16) = reinterpret_cast<const uint4*>(row_src)[lane];
  __syncwarp();
}

// Per-head RMSNorm of the item's q heads and, when it appends, of the new k (v copied as is), from
// the raw QKV rows (written by other SMs: ld.global.cg): warp h for head h. A model without q/k
// norms (lw.q_norm == nullptr: cohere2_moe) copies q and k as they are, as the emulator does.
__device__ inline void attn_qk_norm(const MkParams& p, const MkLayerWeights& lw, const float* raw, int gs, int D,
                                    bool appends, AttnScratch& sc) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int h = warp; h < gs + (appends ? 2 : 0); h += kConsumerWarps) {
    const float* src = raw + h * D;
    float v[kAttnMaxDim / 32];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kAttnMaxDim / 32; ++j) {
      const int d = lane + 32 * j;
      v[j] = d < D ? __ldcg(src + d) : 0.0f;
      ss += v[j] * v[j];
    }
    if (h == gs + 1) {  // v: no norm
#pragma unroll
      for (int j = 0; j < kAttnMaxDim / 32; ++j)
        if (lane + 32 * j < D) sc.vn[lane + 32 * j] = v[j];
      continue;
    }
    if (lw.q_norm == nullptr) {  // no q/k norms (uniform: one layer's weights)
      float* dst = h < gs ? sc.qn[h] : sc.kn;
#pragma unroll
      for (int j = 0; j < kAttnMaxDim / 32; ++j)
        if (lane + 32 * j < D) dst[lane + 32 * j] = v[j];
      continue;
    }
    const float r = head_rms_scale(ss, D, p.w.rms_eps);
    const uint16_t* nw = h < gs ? lw.q_norm : lw.k_norm;
    float* dst = h < gs ? sc.qn[h] : sc.kn;
#pragma unroll
    for (int j = 0; j < kAttnMaxDim / 32; ++j) {
      const int d = lane + 32 * j;
      if (d < D) dst[d] = (v[j] * r) * bf16_bits_to_float(nw[d]);
    }
  }
}

// Element d of a normed head rotated at the item's position: NeoX halves, or interleaved pairs
// when the model says so (p.w.rope_interleaved: cohere2_moe's sliding layers). `cs`: the
// position's row of the RoPE table.
__device__ __forceinline__ float attn_rope(const MkParams& p, const float* x, int d, int half, const float2* cs) {
  return p.w.rope_interleaved ? rope_interleaved(x, d, cs[d >> 1]) : rope_neox(x, d, half, cs[d & (half - 1)]);
}

// q/k RMSNorm, RoPE at the new position (not with `rope` false: the ATTN flag kAttnNoRope), and
// (appending item) the new K/V row: to the cache (the paged pool, or a sliding layer's ring) and to
// sc.knew/vnew; then q as kAttnTerms bf16 MMA terms in shared memory (lane-consecutive words).
__device__ inline void attn_prologue(const MkParams& p, int layer, const AttnItem& it, const AttnGeo& geo, bool appends,
                                     bool rope, uint16_t* kc, uint16_t* vc, AttnScratch& sc) {
  const PlanShape& s = p.plan.shape;
  const MkLayerWeights& lw = p.w.layers[layer];
  const int tid = threadIdx.x;
  const int G = s.n_kv_heads, gs = s.group_size, D = s.head_dim, pos = geo.new_pos;
  const float* raw = buf<float>(p, p.plan.buffers.qkv) + (static_cast<int64_t>(it.seq) * G + it.group) * (gs + 2) * D;
  attn_qk_norm(p, lw, raw, gs, D, appends, sc);
  consumer_sync();
  const int half = D / 2, d_shift = log2_pow2(D);
  const float2* cs = p.w.rope + static_cast<int64_t>(pos) * half;  // pos < rope_positions: op_attn checked
  for (int idx = tid; idx < (gs + (appends ? 1 : 0)) * D; idx += kConsumerThreads) {
    const int h = idx >> d_shift, d = idx & (D - 1);
    if (h < gs) {
      sc.q[h][d] = rope ? attn_rope(p, sc.qn[h], d, half, cs) : sc.qn[h][d];
    } else {
      const uint16_t kb = float_to_bf16_bits(rope ? attn_rope(p, sc.kn, d, half, cs) : sc.kn[d]);
      const uint16_t vb = float_to_bf16_bits(sc.vn[d]);
      const int64_t at = geo.at(pos) + d;
      kc[at] = kb;
      vc[at] = vb;
      sc.knew[d] = kb;
      sc.vnew[d] = vb;
    }
  }
  consumer_sync();  // q and the new row are ready
  for (int i = tid; i < (D / 16) * 4 * 32; i += kConsumerThreads) {
    const int ln = i % 32, r = (i / 32) % 4, kchunk = i / 128;
    const AttnRC rc = attn_qfrag_coord(ln, r, kchunk);
    const bool use = rc.row < gs;
    attn_pack_terms(use ? sc.q[rc.row][rc.col] : 0.0f, use ? sc.q[rc.row][rc.col + 1] : 0.0f, &sc.qfrag[0][kchunk][r][ln],
                    (kAttnMaxDim / 16) * 4 * 32);
  }
  consumer_sync();
}

// After every consumer wrote this split's partial: publish it (acq_rel) and count the split in.
// 1: this item arrived last and merges the (seq, group); 0: another will; -1: over-arrival (error
// recorded).
__device__ inline int attn_publish_split(const MkParams& p, int layer, int task, const AttnItem& it, int32_t& old) {
  consumer_sync();
  if (threadIdx.x == 0) {
    const CounterLayout& c = p.plan.counters;
    int32_t* split_ctr =
        counter_ptr(p, layer_counter(c, layer, c.attn_split + it.seq * p.plan.shape.n_kv_heads + it.group));
    old = atom_add_acq_rel_gpu(split_ctr, 1);
  }
  consumer_sync();
  const int32_t seen = old;
  if (seen >= it.n_splits) {
    if (threadIdx.x == 0) set_error(p, kMkBadInput, -1, seen, it.n_splits, task, it.split);
    return -1;
  }
  return seen == it.n_splits - 1 ? 1 : 0;
}

static_assert((2 * kAttnMergeMaxSplits + 1) * kAttnMaxGroup * 4 <= static_cast<int>(sizeof(AttnScratch::stage)));

// The last arriver's merge of its (seq, group)'s splits, in split order, in parallel: first every
// split's (m, l) into shared memory (one load each), each head's max, weights and total l (one
// thread a head, split order), then each thread takes 4 consecutive elements of one head: one
// 16-byte load per split, 16 in flight. Writes the group's bf16 output rows, then arrives on
// attn_done. `sc`: the item's scratch (its stages are free by now).
__device__ inline void attn_merge_splits(const MkParams& p, int layer, const AttnItem& it, AttnScratch& sc) {
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const int gs = s.group_size, D = s.head_dim;
  const float* po = buf<float>(p, b.attn_part_o) + static_cast<int64_t>(it.part_base) * gs * D;
  const float* pml = buf<float>(p, b.attn_part_ml) + static_cast<int64_t>(it.part_base) * gs * 2;
  uint16_t* out = buf<uint16_t>(p, b.attn_out) + static_cast<int64_t>(it.seq) * s.n_heads * D +
                  static_cast<int64_t>(it.group) * gs * D;
  const int n = it.n_splits;  // <= kAttnMergeMaxSplits: op_attn checked
  float* wgt = reinterpret_cast<float*>(sc.stage);  // [split][head]: the max m, then the split's weight
  float* lsum = wgt + kAttnMergeMaxSplits * kAttnMaxGroup;   // [split][head]: l
  float* ltot = lsum + kAttnMergeMaxSplits * kAttnMaxGroup;  // [head]: the merged l
#pragma unroll 4
  for (int i = threadIdx.x; i < n * gs; i += kConsumerThreads) {
    const float2 ml = __ldcg(reinterpret_cast<const float2*>(pml) + i);
    wgt[i] = ml.x;
    lsum[i] = ml.y;
  }
  consumer_sync();
  if (threadIdx.x < gs) {
    const int h = threadIdx.x;
    float mx = -INFINITY, l = 0.0f;
    for (int sp = 0; sp < n; ++sp) mx = fmaxf(mx, wgt[sp * gs + h]);
    for (int sp = 0; sp < n; ++sp) {
      const float f = attn_merge_weight(wgt[sp * gs + h], mx);
      wgt[sp * gs + h] = f;
      l += f * lsum[sp * gs + h];
    }
    ltot[h] = l;
  }
  consumer_sync();
  for (int q = threadIdx.x; q < gs * D / 4; q += kConsumerThreads) {
    const int h = (q * 4) >> log2_pow2(D);
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 8
    for (int sp = 0; sp < n; ++sp) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(po + static_cast<int64_t>(sp) * gs * D) + q);
      const float f = wgt[sp * gs + h];
      o[0] += f * v.x;
      o[1] += f * v.y;
      o[2] += f * v.z;
      o[3] += f * v.w;
    }
    const float l = ltot[h];
    uint2 packed;
    packed.x = static_cast<uint32_t>(float_to_bf16_bits(attn_normalise(o[0], l))) |
               (static_cast<uint32_t>(float_to_bf16_bits(attn_normalise(o[1], l))) << 16);
    packed.y = static_cast<uint32_t>(float_to_bf16_bits(attn_normalise(o[2], l))) |
               (static_cast<uint32_t>(float_to_bf16_bits(attn_normalise(o[3], l))) << 16);
    reinterpret_cast<uint2*>(out)[q] = packed;
  }
  consumer_sync();
  if (threadIdx.x == 0) arrive_counter(p, layer_counter(p.plan.counters, layer, p.plan.counters.attn_done), 1);
}

}  // namespace megadecode::cuda::mk
