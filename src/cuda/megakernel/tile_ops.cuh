// The megakernel's non-GEMM tile ops, run by the 256 consumer threads of a CTA: the norms (with
// their fused prologues: embedding at layer 0, MoE combine, O-proj group reduction), the attention
// item (q/k norm, RoPE, KV append, split partial, last-arriver log-sum-exp merge) and DISPATCH
// (top-k, per-expert token lists, MoE items, credits). Sampling is in sample.cuh.
// Every reduction is in a fixed order (no float atomics); every op passes the same named
// barriers in every thread. Data other SMs wrote in this launch is read with ld.global.cg
// (__ldcg) after the producer's acquire, never through the non-coherent path.
#pragma once

#include <cstdint>

#include "cuda/megakernel/attention_geo.h"  // kAttnMaxGroup, kAttnMaxDim
#include "cuda/megakernel/sync.cuh"
#include "cuda/megakernel/work.h"
#include "cuda/common/moe.cuh"
#include "cuda/common/qk_norm_rope.cuh"
#include "cuda/common/rms_norm.cuh"

namespace megadecode::cuda::mk {

constexpr int kNormPer = 16;      // hidden <= 16 * 256
constexpr int kAttnChunk = 256;   // key positions per attention chunk (one per consumer thread)

template <typename T>
__device__ __forceinline__ T* buf(const MkParams& p, const BufferSpan& s) {
  return reinterpret_cast<T*>(p.arena + s.offset);
}

// Sum over the 256 consumers, fixed order: per-thread, warp butterfly, warps in order.
__device__ __forceinline__ float consumer_sum(float v, float* scratch) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  v = warp_sum(v);
  consumer_sync();
  if (lane == 0) scratch[warp] = v;
  consumer_sync();
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < kConsumerWarps; ++w) s += scratch[w];
  return s;
}

// out = bf16(bf16(v * rsqrt(mean(v^2) + eps)) * weight): the HF RMSNorm rounding points.
__device__ __forceinline__ void norm_store(const float (&v)[kNormPer], int n, const uint16_t* weight, float eps,
                                           uint16_t* out, float* scratch) {
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kNormPer; ++j) ss += v[j] * v[j];  // v is 0 past n
  const float r = rsqrtf(consumer_sum(ss, scratch) / static_cast<float>(n) + eps);
#pragma unroll
  for (int j = 0; j < kNormPer; ++j) {
    const int i = threadIdx.x + j * kConsumerThreads;
    if (i < n) out[i] = float_to_bf16_bits(round_bf16(v[j] * r) * bf16_bits_to_float(weight[i]));
  }
}

// Residual after layer `layer`'s MoE for token t: h + sum_k w_k * down_out[slot(t, k)] (k order).
__device__ __forceinline__ void moe_residual(const MkParams& p, int t, float (&v)[kNormPer]) {
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const float* h = buf<float>(p, b.h) + static_cast<int64_t>(t) * s.hidden;
  const float* down = buf<float>(p, b.down_out);
  const int32_t* slot = buf<int32_t>(p, b.token_slot) + t * s.top_k;
  const float* wk = buf<float>(p, b.topk_w) + t * s.top_k;
#pragma unroll
  for (int j = 0; j < kNormPer; ++j) v[j] = 0.0f;
  for (int k = 0; k < s.top_k; ++k) {
    const float w = __ldcg(wk + k);
    const float* d = down + static_cast<int64_t>(__ldcg(slot + k)) * s.hidden;
#pragma unroll
    for (int j = 0; j < kNormPer; ++j) {
      const int i = threadIdx.x + j * kConsumerThreads;
      if (i < s.hidden) v[j] += w * __ldcg(d + i);
    }
  }
#pragma unroll
  for (int j = 0; j < kNormPer; ++j) {
    const int i = threadIdx.x + j * kConsumerThreads;
    v[j] = i < s.hidden ? __ldcg(h + i) + v[j] : 0.0f;
  }
}

// ATTN_NORM: x = embedding (layer 0) or the previous layer's MoE residual; xn = norm(x) (bf16).
__device__ inline bool op_attn_norm(const MkParams& p, const Work& wk, float* scratch) {
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const MkLayerWeights& lw = p.w.layers[wk.layer];
  for (int t = wk.arg[0]; t < wk.arg[1]; ++t) {
    float v[kNormPer];
    if (wk.layer == 0) {
      const int32_t tok = buf<int32_t>(p, b.token_ids)[t];
      if (tok < 0 || tok >= s.vocab) {  // uniform: every thread reads the same id
        if (threadIdx.x == 0) set_error(p, kMkBadItem, -1, tok, s.vocab, wk.task, t);
        return false;
      }
      const uint16_t* e = p.w.embed + static_cast<int64_t>(tok) * s.hidden;
#pragma unroll
      for (int j = 0; j < kNormPer; ++j) {
        const int i = threadIdx.x + j * kConsumerThreads;
        v[j] = i < s.hidden ? bf16_bits_to_float(e[i]) : 0.0f;
      }
    } else {
      moe_residual(p, t, v);
    }
    float* x = buf<float>(p, b.x) + static_cast<int64_t>(t) * s.hidden;
#pragma unroll
    for (int j = 0; j < kNormPer; ++j) {
      const int i = threadIdx.x + j * kConsumerThreads;
      if (i < s.hidden) x[i] = v[j];
    }
    norm_store(v, s.hidden, lw.input_norm, p.w.rms_eps, buf<uint16_t>(p, b.xn) + static_cast<int64_t>(t) * s.hidden,
               scratch);
  }
  return true;
}

// MOE_NORM: h = x + sum_g o_part[g] (group order); hn = norm(h) (bf16).
__device__ inline bool op_moe_norm(const MkParams& p, const Work& wk, float* scratch) {
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const MkLayerWeights& lw = p.w.layers[wk.layer];
  const float* opart = buf<float>(p, b.o_part);
  for (int t = wk.arg[0]; t < wk.arg[1]; ++t) {
    const float* x = buf<float>(p, b.x) + static_cast<int64_t>(t) * s.hidden;
    float* h = buf<float>(p, b.h) + static_cast<int64_t>(t) * s.hidden;
    float v[kNormPer];
#pragma unroll
    for (int j = 0; j < kNormPer; ++j) {
      const int i = threadIdx.x + j * kConsumerThreads;
      float acc = 0.0f;
      if (i < s.hidden) {
        for (int g = 0; g < s.n_kv_heads; ++g)
          acc += __ldcg(opart + (static_cast<int64_t>(g) * s.batch + t) * s.hidden + i);
        acc = __ldcg(x + i) + acc;
        h[i] = acc;
      }
      v[j] = i < s.hidden ? acc : 0.0f;
    }
    norm_store(v, s.hidden, lw.post_norm, p.w.rms_eps, buf<uint16_t>(p, b.hn) + static_cast<int64_t>(t) * s.hidden,
               scratch);
  }
  return true;
}

// FINAL_NORM: the last layer's MoE residual, then xf = norm (bf16).
__device__ inline bool op_final_norm(const MkParams& p, const Work& wk, float* scratch) {
  const PlanShape& s = p.plan.shape;
  for (int t = wk.arg[0]; t < wk.arg[1]; ++t) {
    float v[kNormPer];
    moe_residual(p, t, v);
    norm_store(v, s.hidden, p.w.final_norm, p.w.rms_eps,
               buf<uint16_t>(p, p.plan.buffers.xf) + static_cast<int64_t>(t) * s.hidden, scratch);
  }
  return true;
}

// ---- attention ----
struct AttnScratch {
  float q[kAttnMaxGroup][kAttnMaxDim];   // normed (then rotated) q
  float qn[kAttnMaxGroup][kAttnMaxDim];  // normed q before RoPE
  float kn[kAttnMaxDim], vn[kAttnMaxDim];
  float p[kAttnMaxGroup][kAttnChunk];    // scores, then probabilities, of one chunk
  float o[kConsumerThreads * kAttnMaxGroup];  // [n_parts = 256 / D][gs][D] partial sums
  float m[kAttnMaxGroup], l[kAttnMaxGroup], alpha[kAttnMaxGroup];
  int32_t old;
};

// Shared by the scalar and the tensor-core attention items (attention.cuh), so both normalise and
// publish identically. Per-head RMSNorm of the item's q heads and, when it appends, of the new k
// (v copied as is), from the raw QKV rows: warp h for head h. Scratch: qn[gs][D], kn[D], vn[D].
template <class Scratch>
__device__ inline void attn_qk_norm(const MkParams& p, const MkLayerWeights& lw, const float* raw, int gs, int D,
                                    bool appends, Scratch& sc) {
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

// RoPE (NeoX halves) of the normed q heads into sc.q, and for the appending item of the new k;
// store(d, k_bf16, v_bf16) receives the new K/V row element by element (the cache write).
template <class Scratch, class Store>
__device__ inline void attn_rope_append(const MkParams& p, int gs, int D, int pos, bool appends, Scratch& sc,
                                        Store store) {
  const int half = D / 2;
  for (int idx = threadIdx.x; idx < (gs + (appends ? 1 : 0)) * D; idx += kConsumerThreads) {
    const int h = idx / D, d = idx % D;
    if (h < gs) {
      sc.q[h][d] = rope_neox(sc.qn[h], d, half, pos, p.w.rope_inv_freq);
    } else {
      const float k = rope_neox(sc.kn, d, half, pos, p.w.rope_inv_freq);
      store(d, float_to_bf16_bits(k), float_to_bf16_bits(sc.vn[d]));
    }
  }
}

// After every consumer wrote this split's partial: publish it (acq_rel) and count the split in.
// 1: this item arrived last and merges the (seq, group); 0: another will; -1: over-arrival (error
// recorded). `old` is a shared-memory slot for thread 0's result.
__device__ inline int attn_publish_split(const MkParams& p, const Work& wk, const AttnItem& it, int32_t& old) {
  consumer_sync();
  if (threadIdx.x == 0) {
    int32_t* split_ctr = counter_ptr(p, layer_counter(p.plan.counters, wk.layer,
                                                      p.plan.counters.attn_split + it.seq * p.plan.shape.n_kv_heads + it.group));
    fence_acq_rel_gpu();
    old = atom_add_acq_rel_gpu(split_ctr, 1);
  }
  consumer_sync();
  const int32_t seen = old;
  if (seen >= it.n_splits) {
    if (threadIdx.x == 0) set_error(p, kMkBadItem, -1, seen, it.n_splits, wk.task, wk.arg[0]);
    return -1;
  }
  return seen == it.n_splits - 1 ? 1 : 0;
}

// The merging (last-arriving) item's view of its (seq, group): the splits' partials in split order
// (o: [n_splits][gs][D], ml: [n_splits][gs][2]) and the group's bf16 output rows.
struct AttnMergeRefs {
  const float* o;
  const float* ml;
  uint16_t* out;
};
__device__ inline AttnMergeRefs attn_merge_refs(const MkParams& p, const AttnItem& it) {
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const int gs = s.group_size, D = s.head_dim;
  return {buf<float>(p, b.attn_part_o) + static_cast<int64_t>(it.part_base) * gs * D,
          buf<float>(p, b.attn_part_ml) + static_cast<int64_t>(it.part_base) * gs * 2,
          buf<uint16_t>(p, b.attn_out) + static_cast<int64_t>(it.seq) * s.n_heads * D +
              static_cast<int64_t>(it.group) * gs * D};
}

// After the merge wrote every output row: the (seq, group) is done for O-proj.
__device__ inline bool attn_merged(const MkParams& p, const Work& wk, const AttnItem& it) {
  consumer_sync();
  if (threadIdx.x == 0)
    mk_arrive(p, layer_counter(p.plan.counters, wk.layer, p.plan.counters.attn_done + it.group), 1);
  return true;
}

// One attention item: q heads of group g of sequence seq over key positions [pos_begin, pos_end).
__device__ inline bool op_attn(const MkParams& p, const Work& wk, AttnScratch& sc) {
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const MkLayerWeights& lw = p.w.layers[wk.layer];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const AttnItem it = buf<const AttnItem>(p, b.attn_items)[wk.arg[0]];
  const int G = s.n_kv_heads, gs = s.group_size, D = s.head_dim, bs = s.kv_block_size;
  const int n = buf<int32_t>(p, b.seq_len)[it.seq];
  const int32_t* bt = buf<int32_t>(p, b.block_tables) + static_cast<int64_t>(it.seq) * s.max_blocks_per_seq;
  const float* raw = buf<float>(p, b.qkv) + (static_cast<int64_t>(it.seq) * G + it.group) * (gs + 2) * D;
  uint16_t* kc = p.kv + static_cast<int64_t>(wk.layer) * p.kv_layer_stride;
  uint16_t* vc = kc + p.kv_v_offset;
  auto kv_at = [&](int pos) {
    return ((static_cast<int64_t>(bt[pos / bs]) * G + it.group) * bs + pos % bs) * D;
  };
  const bool appends = it.pos_end == n;

  // 1. per-head RMSNorm of q (and of the new k), warp h for head h.
  attn_qk_norm(p, lw, raw, gs, D, appends, sc);
  if (tid < gs) {
    sc.m[tid] = -INFINITY;
    sc.l[tid] = 0.0f;
  }
  consumer_sync();
  // 2. RoPE (NeoX halves) at position n-1; the appending item writes the new K/V (bf16).
  attn_rope_append(p, gs, D, n - 1, appends, sc, [&](int d, uint16_t kb, uint16_t vb) {
    const int64_t at = kv_at(n - 1) + d;
    kc[at] = kb;
    vc[at] = vb;
  });
  consumer_sync();  // q ready; the new K/V row is visible to this CTA's loads below

  // 3. chunks of key positions: scores, running max/sum, P.V.
  const int n_parts = kConsumerThreads / D;
  const int part = tid / D, dd = tid % D;
  float o[kAttnMaxGroup];
#pragma unroll
  for (int h = 0; h < kAttnMaxGroup; ++h) o[h] = 0.0f;
  for (int c0 = it.pos_begin; c0 < it.pos_end; c0 += kAttnChunk) {
    const int P = min(kAttnChunk, it.pos_end - c0);
    if (tid < P) {
      const uint4* krow = reinterpret_cast<const uint4*>(kc + kv_at(c0 + tid));
      float acc[kAttnMaxGroup];
#pragma unroll
      for (int h = 0; h < kAttnMaxGroup; ++h) acc[h] = 0.0f;
      for (int d8 = 0; d8 < D / 8; ++d8) {
        const uint4 kv8 = krow[d8];
        const uint32_t wds[4] = {kv8.x, kv8.y, kv8.z, kv8.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float kval = bf16_bits_to_float(static_cast<uint16_t>(wds[e / 2] >> (16 * (e & 1))));
#pragma unroll
          for (int h = 0; h < kAttnMaxGroup; ++h)
            if (h < gs) acc[h] += sc.q[h][d8 * 8 + e] * kval;
        }
      }
#pragma unroll
      for (int h = 0; h < kAttnMaxGroup; ++h)
        if (h < gs) sc.p[h][tid] = acc[h] * p.w.attn_scale;
    } else {
#pragma unroll
      for (int h = 0; h < kAttnMaxGroup; ++h)
        if (h < gs) sc.p[h][tid] = -INFINITY;
    }
    consumer_sync();
    for (int h = warp; h < gs; h += kConsumerWarps) {
      float mc = -INFINITY;
      for (int j = lane; j < kAttnChunk; j += 32) mc = fmaxf(mc, sc.p[h][j]);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, off));
      const float m_old = sc.m[h];
      const float m_new = fmaxf(m_old, mc);
      float ls = 0.0f;
      for (int j = lane; j < kAttnChunk; j += 32) {
        const float e = expf(sc.p[h][j] - m_new);  // exp(-inf) = 0 past the chunk's end
        sc.p[h][j] = e;
        ls += e;
      }
      ls = warp_sum(ls);
      __syncwarp();
      if (lane == 0) {
        const float a = expf(m_old - m_new);  // 0 on the first chunk
        sc.alpha[h] = a;
        sc.l[h] = sc.l[h] * a + ls;
        sc.m[h] = m_new;
      }
    }
    consumer_sync();
#pragma unroll
    for (int h = 0; h < kAttnMaxGroup; ++h)
      if (h < gs) o[h] *= sc.alpha[h];
    for (int j = part; j < P; j += n_parts) {
      const float v = bf16_bits_to_float(vc[kv_at(c0 + j) + dd]);
#pragma unroll
      for (int h = 0; h < kAttnMaxGroup; ++h)
        if (h < gs) o[h] += sc.p[h][j] * v;
    }
    consumer_sync();  // sc.p is rewritten by the next chunk
  }
  // 4. the item's partial: parts summed in part order.
#pragma unroll
  for (int h = 0; h < kAttnMaxGroup; ++h)
    if (h < gs) sc.o[(part * gs + h) * D + dd] = o[h];
  consumer_sync();
  const int item_part = it.part_base + it.split;
  float* po = buf<float>(p, b.attn_part_o) + static_cast<int64_t>(item_part) * gs * D;
  float* pml = buf<float>(p, b.attn_part_ml) + static_cast<int64_t>(item_part) * gs * 2;
  for (int idx = tid; idx < gs * D; idx += kConsumerThreads) {
    float acc = 0.0f;
    for (int q = 0; q < n_parts; ++q) acc += sc.o[q * gs * D + idx];
    po[idx] = acc;
  }
  if (tid < gs) {
    pml[tid * 2] = sc.m[tid];
    pml[tid * 2 + 1] = sc.l[tid];
  }
  // 5. publish; the last of the (seq, group)'s splits to arrive merges them.
  const int elected = attn_publish_split(p, wk, it, sc.old);
  if (elected <= 0) return elected == 0;
  const AttnMergeRefs mr = attn_merge_refs(p, it);
  for (int idx = tid; idx < gs * D; idx += kConsumerThreads) {
    const int h = idx / D;
    float mx = -INFINITY;
    for (int sp = 0; sp < it.n_splits; ++sp) mx = fmaxf(mx, __ldcg(mr.ml + (sp * gs + h) * 2));
    float num = 0.0f, den = 0.0f;
    for (int sp = 0; sp < it.n_splits; ++sp) {
      const float f = expf(__ldcg(mr.ml + (sp * gs + h) * 2) - mx);
      den += __ldcg(mr.ml + (sp * gs + h) * 2 + 1) * f;
      num += __ldcg(mr.o + static_cast<int64_t>(sp) * gs * D + idx) * f;
    }
    mr.out[idx] = float_to_bf16_bits(num / den);
  }
  return attn_merged(p, wk, it);
}

// ---- DISPATCH ----
struct DispatchScratch {
  int32_t ids[kGemmMaxTokens * kRouterMaxTopK];
  int32_t count[kRouterMaxExperts];
  int32_t offset[kRouterMaxExperts + 1];
  int32_t active[kRouterMaxExperts];  // active experts in expert order
  int32_t n_active;
};

__device__ inline bool op_dispatch(const MkParams& p, const Work& wk, DispatchScratch& sc) {
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const CounterLayout& c = p.plan.counters;
  const int tid = threadIdx.x, warp = tid >> 5;
  const int B = s.batch, K = s.top_k, E = s.n_experts, L = wk.layer;
  int32_t* topk_ids = buf<int32_t>(p, b.topk_ids);
  float* topk_w = buf<float>(p, b.topk_w);
  // 1. softmax + top-k per token (one warp per token; cuda/common/moe.cuh).
  for (int t = warp; t < B; t += kConsumerWarps)
    router_topk_warp(buf<float>(p, b.router_logits) + static_cast<int64_t>(t) * E, E, K, p.w.norm_topk != 0,
                     topk_ids + t * K, topk_w + t * K);
  consumer_sync();  // global writes of this CTA are visible to its own threads after the barrier
  for (int i = tid; i < B * K; i += kConsumerThreads) {
    sc.ids[i] = topk_ids[i];
    if (p.route_ids) {  // routing capture (tests): [token][layer][k]
      const int64_t at = (static_cast<int64_t>(i / K) * s.n_layers + L) * K + i % K;
      p.route_ids[at] = topk_ids[i];
      p.route_w[at] = topk_w[i];
    }
  }
  consumer_sync();
  // 2. tokens per expert, prefix sum, slots in (expert, token, k) order.
  for (int e = tid; e < E; e += kConsumerThreads) {
    int n = 0;
    for (int i = 0; i < B * K; ++i) n += sc.ids[i] == e;
    sc.count[e] = n;
  }
  consumer_sync();
  if (tid == 0) {
    int off = 0, na = 0;
    for (int e = 0; e < E; ++e) {
      sc.offset[e] = off;
      off += sc.count[e];
      if (sc.count[e] > 0) sc.active[na++] = e;
    }
    sc.offset[E] = off;
    sc.n_active = na;
  }
  consumer_sync();
  int32_t* token_slot = buf<int32_t>(p, b.token_slot);
  int32_t* expert_tokens = buf<int32_t>(p, b.expert_tokens);
  for (int e = tid; e < E; e += kConsumerThreads) {
    int slot = sc.offset[e];
    for (int i = 0; i < B * K; ++i)
      if (sc.ids[i] == e) {
        token_slot[i] = slot;
        expert_tokens[slot] = i / K;
        ++slot;
      }
    buf<int32_t>(p, b.expert_count)[e] = sc.count[e];
    buf<int32_t>(p, b.expert_offset)[e] = sc.offset[e];
  }
  if (tid == 0) buf<int32_t>(p, b.expert_offset)[E] = sc.offset[E];
  // 3. items, expert-major: up (expert, column block), down (expert, row block).
  const int na = sc.n_active;
  const int n_up = na * s.up_blocks, n_down = na * s.down_blocks;
  if (n_up > s.up_capacity || n_down > s.down_capacity) {
    if (tid == 0) set_error(p, kMkQueueOverflow, -1, n_up, s.up_capacity, wk.task, n_down);
    return false;
  }
  for (int i = tid; i < n_up; i += kConsumerThreads)
    buf<int32_t>(p, b.up_items)[i] = pack_moe_item(sc.active[i / s.up_blocks], i % s.up_blocks);
  for (int i = tid; i < n_down; i += kConsumerThreads)
    buf<int32_t>(p, b.down_items)[i] = pack_moe_item(sc.active[i / s.down_blocks], i % s.down_blocks);
  if (tid == 0) {
    buf<int32_t>(p, b.moe_n_items)[L * 2] = n_up;
    buf<int32_t>(p, b.moe_n_items)[L * 2 + 1] = n_down;
  }
  consumer_sync();
  // 4. credits for what routing did not produce, so every target stays static (task.h). They
  // publish no data; the task's own arrive on dispatch_done (after this op) releases the tables.
  if (tid == 0) fence_acq_rel_gpu();
  consumer_sync();
  for (int e = tid; e < E; e += kConsumerThreads)
    if (sc.count[e] == 0) red_relaxed_gpu_add(counter_ptr(p, layer_counter(c, L, c.up_done + e)), s.up_blocks);
  if (tid == 0 && na < E) red_relaxed_gpu_add(counter_ptr(p, layer_counter(c, L, c.down_done)), (E - na) * s.down_blocks);
  return true;
}

}  // namespace megadecode::cuda::mk
