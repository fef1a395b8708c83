// The megakernel's attention item (one ATTN task): q heads of one KV group of one sequence over key
// positions [pos_begin, pos_end) on m16n8k16 MMAs (q heads = MMA rows). Each consumer warp pipelines
// its own 16-token chunks c = warp, warp + 8, ... (K of chunk c+8 streams during P.V of chunk c; no
// CTA barrier per chunk). Its first chunk is requested BEFORE the task's QKV wait, which the item
// makes itself. Precision: q and P as kAttnTerms (2) bf16 terms (~16 mantissa bits); each chunk's
// P.V starts from zero and is added to the running output in fp32. Determinism: fixed chunk-to-warp
// map, warps merged in warp order, splits merged in split order by the last arriver.
#pragma once

#include <cstdint>

#include "cuda/megakernel/attention.cuh"

namespace megadecode::cuda::mk {

// The item of task `t` (index `task`): returns false when the step failed (uniformly). A full
// layer's item reads the block tables and the paged pool; a sliding layer's (ATTN flag
// kAttnSliding) its ring table and the ring pool (AttnGeo::ring_len > 0).
__device__ inline bool op_attn(const MkParams& p, const Task& t, int task, AttnScratch& sc) {
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int layer = t.layer;
  if (t.arg[0] < 0 || t.arg[0] >= s.n_attn_items) {
    if (tid == 0) set_error(p, kMkBadInput, -1, t.arg[0], s.n_attn_items, task, -1);
    return false;
  }
  const AttnItem it = buf<const AttnItem>(p, b.attn_items)[t.arg[0]];
  if (!attn_item_in_range(s, it)) {
    if (tid == 0) set_error(p, kMkBadInput, -1, it.seq, it.group, task, t.arg[0]);
    return false;
  }
  const int G = s.n_kv_heads, gs = s.group_size, D = s.head_dim;
  const int n = buf<int32_t>(p, b.seq_len)[it.seq];
  if (n > p.w.rope_positions || it.pos_end > n) {  // the new position n - 1 is past the RoPE table
    if (tid == 0) set_error(p, kMkBadInput, -1, n, p.w.rope_positions, task, t.arg[0]);
    return false;
  }
  const bool appends = it.pos_end == n;
  uint16_t* kc;
  uint16_t* vc;
  AttnGeo geo;
  if (t.flags & kAttnSliding) {
    // A sliding layer reads its last sliding_window positions from the ring; an item reaching
    // further back would read ring slots that newer positions overwrote.
    const int32_t ring_layer = p.w.layers[layer].kv_ring_index;
    if (ring_layer < 0 || p.kv_ring == nullptr || s.ring_len <= 0 || it.pos_begin < n - s.sliding_window) {
      if (tid == 0) set_error(p, kMkBadInput, -1, it.pos_begin, n - s.sliding_window, task, t.arg[0]);
      return false;
    }
    kc = p.kv_ring + static_cast<int64_t>(ring_layer) * p.kv_ring_layer_stride;
    vc = kc + p.kv_ring_v_offset;
    geo = AttnGeo{buf<int32_t>(p, b.ring_tables) + static_cast<int64_t>(it.seq) * s.ring_len, G, it.group,
                  s.kv_block_size, D, it.pos_begin, it.pos_end, n - 1, s.ring_len};
  } else {
    // A full-attention layer: its slice of the full pool (a sliding layer has none). Without
    // sliding layers the slice is the layer's own, and no load is needed.
    const int32_t full_layer = s.sliding_window == 0 ? layer : p.w.layers[layer].kv_full_index;
    if (full_layer < 0) {
      if (tid == 0) set_error(p, kMkBadInput, -1, layer, full_layer, task, t.arg[0]);
      return false;
    }
    kc = p.kv + static_cast<int64_t>(full_layer) * p.kv_layer_stride;
    vc = kc + p.kv_v_offset;
    geo = AttnGeo{buf<int32_t>(p, b.block_tables) + static_cast<int64_t>(it.seq) * s.max_blocks_per_seq,
                  G, it.group, s.kv_block_size, D, it.pos_begin, it.pos_end, n - 1};
  }
  const int n_chunks = attn_n_chunks(it.pos_begin, it.pos_end);
  uint8_t* ks = sc.stage[warp][0];
  uint8_t* vs = sc.stage[warp][1];

  // 0. this warp's first chunk streams while the QKV projection of this group finishes.
  if (warp < n_chunks) {
    attn_load(geo, kc, warp, ks, lane);
    attn_load(geo, vc, warp, vs, lane);
  }
  if (consumer_any(!wait_counters(p, t, task, 0, t.n_waits))) {
    ptx::cp_async_wait<0>();  // no copy may land after this op gave the shared memory up
    return false;
  }
  // 1-2. norms, RoPE, append, q terms.
  TraceClock phase;
  phase.start(p);
  attn_prologue(p, layer, it, geo, appends, (t.flags & kAttnNoRope) == 0, kc, vc, sc);
  phase.stop(p, t, task, kPhaseAttnPrologue);

  // 3. this warp's chunks. Per lane: rows g, g + 8 of the accumulators (log2 domain).
  const float scale_log2 = attn_scale_log2(p.w.attn_scale);
  const int n_kc = D / 16;
  float o[kAttnMaxDim / 8][4];
#pragma unroll
  for (int dn = 0; dn < kAttnMaxDim / 8; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  // Group accounting (per thread, every lane commits alike): before the loop K(c0), V(c0); each
  // iteration commits K(c+8) then V(c+8) (an empty group past the end), so wait_group 1 at the
  // top leaves only V(c) pending, and after K(c+8)'s commit only K(c+8).
  for (int c = warp; c < n_chunks; c += kConsumerWarps) {
    ptx::cp_async_wait<1>();  // K of chunk c
    __syncwarp();             // every lane's copies of K(c) are visible to the warp
    if (appends) attn_patch(geo, c, sc.knew, ks, lane);
    float sv[2][4] = {};  // scores: [n8 tile][element], attn_score_coord
#pragma unroll
    for (int kk = 0; kk < kAttnMaxDim / 16; ++kk) {
      if (kk < n_kc) {
        uint32_t bk[4];
        const AttnRC a = attn_k_ldm(lane, kk);
        ptx::ldmatrix_x4(bk, ks + a.row * kAttnPitch + a.col * 2);
#pragma unroll
        for (int term = 0; term < kAttnTerms; ++term) {
          const uint32_t qa[4] = {sc.qfrag[term][kk][0][lane], sc.qfrag[term][kk][1][lane], sc.qfrag[term][kk][2][lane],
                                  sc.qfrag[term][kk][3][lane]};
          ptx::mma_bf16_16816(sv[0], qa, bk[0], bk[1]);
          ptx::mma_bf16_16816(sv[1], qa, bk[2], bk[3]);
        }
      }
    }
    __syncwarp();  // every lane's ldmatrix of K(c) is done: the stage may be refilled
    const int next = c + kConsumerWarps;
    if (next < n_chunks) attn_load(geo, kc, next, ks, lane);
    else ptx::cp_async_commit();  // an empty group keeps the wait counts uniform
    // Masking past the split's end (zero-filled rows), online softmax over the quad of lanes
    // that shares a row (xor 1, 2).
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const AttnFragRow<2> row{sv, h};
      const float mx = attn_scale_mask(row.kScores, row, scale_log2, [&](int i) {
        return geo.token(c, attn_score_coord(lane, i >> 1, 2 * h + (i & 1)).col) < it.pos_end;
      });
      alpha[h] = attn_online_step(m[h], l[h], quad_max(mx), row.kScores, row, AttnIdentity{},
                                  [](float x) { return quad_sum(x); });
    }
    // P as A fragments: a0 (row g, tokens 2t..) = tile 0 e0,e1; a1 (row g+8) = tile 0 e2,e3;
    // a2, a3 the same of tile 1.
    uint32_t pa[kAttnTerms][4];
    attn_pack_terms(sv[0][0], sv[0][1], &pa[0][0], 4);
    attn_pack_terms(sv[0][2], sv[0][3], &pa[0][1], 4);
    attn_pack_terms(sv[1][0], sv[1][1], &pa[0][2], 4);
    attn_pack_terms(sv[1][2], sv[1][3], &pa[0][3], 4);
    ptx::cp_async_wait<1>();  // V of chunk c (K of the next chunk may still be in flight)
    __syncwarp();
    if (appends) attn_patch(geo, c, sc.vnew, vs, lane);
    // O = O * alpha + P V, the chunk's P V from zero (tensor-core sums stay short).
#pragma unroll
    for (int dn = 0; dn < kAttnMaxDim / 8; dn += 2) {
      if (dn < D / 8) {
        uint32_t bv[4];
        const AttnRC a = attn_v_ldm(lane, dn);
        ptx::ldmatrix_x4_trans(bv, vs + a.row * kAttnPitch + a.col * 2);
        float a0[4] = {}, a1[4] = {};
#pragma unroll
        for (int term = 0; term < kAttnTerms; ++term) {
          const uint32_t pt[4] = {pa[term][0], pa[term][1], pa[term][2], pa[term][3]};
          ptx::mma_bf16_16816(a0, pt, bv[0], bv[1]);
          ptx::mma_bf16_16816(a1, pt, bv[2], bv[3]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          o[dn][e] = fmaf(o[dn][e], alpha[e >> 1], a0[e]);
          o[dn + 1][e] = fmaf(o[dn + 1][e], alpha[e >> 1], a1[e]);
        }
      }
    }
    __syncwarp();  // every lane's ldmatrix of V(c) is done
    if (next < n_chunks) attn_load(geo, vc, next, vs, lane);
    else ptx::cp_async_commit();
  }
  ptx::cp_async_wait<0>();
  consumer_sync();  // every warp is done with the stages: they become the merge area
  phase.start(p);

  // 4. the warps' states merged in warp order -> the item's partial (unnormalised o, m, l).
  float* red_o = reinterpret_cast<float*>(sc.stage);  // [warp][gs][D]
  float* red_ml = red_o + kConsumerWarps * gs * D;    // [warp][gs][2]
#pragma unroll
  for (int dn = 0; dn < kAttnMaxDim / 8; ++dn) {
    if (dn < D / 8) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const AttnRC rc = attn_out_coord(lane, dn, e);
        if (rc.row < gs) red_o[(warp * gs + rc.row) * D + rc.col] = o[dn][e];
      }
    }
  }
  if ((lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = (lane >> 2) + 8 * h;
      if (row < gs) {
        red_ml[(warp * gs + row) * 2] = m[h];
        red_ml[(warp * gs + row) * 2 + 1] = l[h];
      }
    }
  }
  consumer_sync();
  const int item_part = it.part_base + it.split;
  float* po = buf<float>(p, b.attn_part_o) + static_cast<int64_t>(item_part) * gs * D;
  float* pml = buf<float>(p, b.attn_part_ml) + static_cast<int64_t>(item_part) * gs * 2;
  for (int idx = tid; idx < gs * D; idx += kConsumerThreads) {
    const int row = idx >> log2_pow2(D), d = idx & (D - 1);
    float mx, sum;
    po[idx] = attn_merge(kConsumerWarps, [&](int w) { return red_ml[(w * gs + row) * 2]; }, [&](int w) {
      const float* ml = red_ml + (w * gs + row) * 2;
      return AttnPartial{ml[0], ml[1], red_o[(w * gs + row) * D + d]};
    }, mx, sum);
    if (d == 0) {
      pml[row * 2] = mx;
      pml[row * 2 + 1] = sum;
    }
  }
  // 5. publish; the last of the (seq, group)'s splits to arrive merges them (split order).
  const int elected = attn_publish_split(p, layer, task, it, sc.old);
  if (elected > 0) attn_merge_splits(p, layer, it, sc);
  phase.stop(p, t, task, kPhaseAttnMerge);
  return elected >= 0;
}

}  // namespace megadecode::cuda::mk
