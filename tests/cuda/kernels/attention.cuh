// Paged decode attention for one work item (sequence, kv head, KV range [t_begin, t_end)) by one
// CTA of 4 warps (device building block). The G <= 16 query heads of the GQA group are the rows of
// the m16n8k16 MMA (tensor cores): every K/V tile is loaded once and serves the whole group.
// Tiles of 64 tokens are double-buffered with 16-byte cp.async (zero-filled past t_end, so noise
// beyond a sequence never reaches the math); warp w takes tokens [16w, 16w+16) of each tile with
// its own online softmax, and the 4 warp states merge in warp order at the end (deterministic).
// Output: o = sum_j 2^(s_j - m) v_j (unnormalised, fp32), m = max_j s_j, l = sum_j 2^(s_j - m),
// where s_j = scale * log2(e) * q.k_j. An empty range gives m = -inf, l = 0, o = 0.
// Q, K and V may have been written earlier in the same launch (megakernel): plain loads / cp.async
// (L2), never the non-coherent path.
#pragma once

#include <cstdint>

#include "core/bf16.h"
#include "cuda/common/attention_state.cuh"
#include "cuda/common/ptx.cuh"

namespace megadecode::cuda {

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = 32 * kAttnWarps;
constexpr int kAttnTile = 16 * kAttnWarps;  // tokens per tile
constexpr int kAttnMaxGroup = 16;

template <int kD>
struct AttnSmem {
  static constexpr int kPitch = kD * 2 + 16;                 // bytes per token row (+16: no ldmatrix conflicts)
  static constexpr int kTileBytes = kAttnTile * kPitch;      // one of K or V
  static constexpr int kStageBytes = 2 * kTileBytes;         // K then V
  static constexpr int kBytes = 2 * kStageBytes;             // double-buffered
  // The final merge reuses the stages: per warp 16 rows x kD floats + 16 (m, l).
  static_assert(kAttnWarps * 16 * (kD + 2) * 4 <= kBytes);
};

// Split s of n_splits over a context of n tokens: chunks rounded up to whole tiles.
MD_HOST_DEVICE inline void attention_split_range(int n, int n_splits, int s, int* begin, int* end) {
  int chunk = (n + n_splits - 1) / n_splits;
  chunk = (chunk + kAttnTile - 1) / kAttnTile * kAttnTile;
  *begin = min(n, s * chunk);
  *end = min(n, *begin + chunk);
}

struct AttnItem {
  const uint16_t* q;            // [group][kD] bf16: the group's query heads, consecutive
  int group;                    // query heads in the group (<= 16)
  const uint16_t* k_cache;      // [n_blocks][n_kv_heads][block_size][kD]
  const uint16_t* v_cache;
  const int32_t* block_table;   // this sequence's row
  int kv_head, n_kv_heads, block_size;
  int t_begin, t_end;
  float scale_log2;             // scale * log2(e)
  float* o;                     // [group] rows of o_row_stride floats (kD used)
  int64_t o_row_stride;
  float* ml;                    // [group] rows of ml_row_stride floats: (m, l)
  int64_t ml_row_stride;
};

template <int kD>
__device__ __forceinline__ void attn_load_tile(const AttnItem& it, int tile_start, uint8_t* stage) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < 2 * kAttnTile * kChunks; c += kAttnThreads) {
    const int which = c / (kAttnTile * kChunks);  // 0: K, 1: V
    const int r = (c / kChunks) % kAttnTile, ch = c % kChunks;
    const int tok = tile_start + r;
    const bool valid = tok < it.t_end;
    const uint16_t* base = which ? it.v_cache : it.k_cache;
    const uint16_t* src = base;
    if (valid) {
      const int64_t block = it.block_table[tok / it.block_size];
      src = base + ((block * it.n_kv_heads + it.kv_head) * it.block_size + tok % it.block_size) * kD + ch * 8;
    }
    ptx::cp_async_16(stage + which * AttnSmem<kD>::kTileBytes + r * AttnSmem<kD>::kPitch + ch * 16, src, valid ? 16 : 0);
  }
}

// The whole CTA (kAttnThreads threads) calls it; `smem` holds AttnSmem<kD>::kBytes, 128-byte aligned.
template <int kD>
__device__ void attention_item(const AttnItem& it, uint8_t* smem) {
  using S = AttnSmem<kD>;
  constexpr int kKC = kD / 16;  // k16 chunks of the head dim
  constexpr int kDN = kD / 8;   // n8 tiles of the output
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;

  // Q fragments (rows = heads g and g + 8; rows >= group are zero).
  uint32_t qa[kKC][4];
#pragma unroll
  for (int kc = 0; kc < kKC; ++kc) {
    const int c0 = kc * 16 + 2 * t;
    auto pair = [&](int row, int col) -> uint32_t {
      return row < it.group ? *reinterpret_cast<const uint32_t*>(it.q + row * kD + col) : 0u;
    };
    qa[kc][0] = pair(g, c0);
    qa[kc][1] = pair(g + 8, c0);
    qa[kc][2] = pair(g, c0 + 8);
    qa[kc][3] = pair(g + 8, c0 + 8);
  }

  float o[kDN][4];
#pragma unroll
  for (int dn = 0; dn < kDN; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g + 8

  const int n_tiles = it.t_end > it.t_begin ? (it.t_end - it.t_begin + kAttnTile - 1) / kAttnTile : 0;
  if (n_tiles > 0) attn_load_tile<kD>(it, it.t_begin, smem);
  ptx::cp_async_commit();
  for (int i = 0; i < n_tiles; ++i) {
    if (i + 1 < n_tiles) attn_load_tile<kD>(it, it.t_begin + (i + 1) * kAttnTile, smem + ((i + 1) & 1) * S::kStageBytes);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    __syncthreads();
    const uint8_t* ks = smem + (i & 1) * S::kStageBytes + warp * 16 * S::kPitch;
    const uint8_t* vs = ks + S::kTileBytes;
    const int tok0 = it.t_begin + i * kAttnTile + warp * 16;

    // S = Q K^T for this warp's 16 tokens (two n8 tiles).
    float s[2][4] = {};
    const int lr = lane & 7, lm = lane >> 3;  // ldmatrix: row within matrix, matrix index
#pragma unroll
    for (int kc = 0; kc < kKC; ++kc) {
      uint32_t b[4];
      ptx::ldmatrix_x4(b, ks + ((lm >> 1) * 8 + lr) * S::kPitch + (kc * 16 + (lm & 1) * 8) * 2);
      ptx::mma_bf16_16816(s[0], qa[kc], b[0], b[1]);
      ptx::mma_bf16_16816(s[1], qa[kc], b[2], b[3]);
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = tok0 + n * 8 + 2 * t + (e & 1);
        s[n][e] = tok < it.t_end ? s[n][e] * it.scale_log2 : -INFINITY;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[n][e]);
      }
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const AttnRescale r = attn_rescale(m[h], quad_max(tile_max[h]));
      m_use[h] = r.m_use;
      alpha[h] = r.alpha;
    }
    float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - m_use[e >> 1]);
        row_sum[e >> 1] += s[n][e];
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + quad_sum(row_sum[h]);
#pragma unroll
    for (int dn = 0; dn < kDN; ++dn) {
      o[dn][0] *= alpha[0];
      o[dn][1] *= alpha[0];
      o[dn][2] *= alpha[1];
      o[dn][3] *= alpha[1];
    }
    // O += P V: P (16 heads x 16 tokens) straight from the S accumulators.
    const uint32_t pa[4] = {ptx::pack_bf16x2(s[0][0], s[0][1]), ptx::pack_bf16x2(s[0][2], s[0][3]),
                            ptx::pack_bf16x2(s[1][0], s[1][1]), ptx::pack_bf16x2(s[1][2], s[1][3])};
#pragma unroll
    for (int dn = 0; dn < kDN; dn += 2) {
      uint32_t b[4];
      ptx::ldmatrix_x4_trans(b, vs + ((lm & 1) * 8 + lr) * S::kPitch + (dn + (lm >> 1)) * 16);
      ptx::mma_bf16_16816(o[dn], pa, b[0], b[1]);
      ptx::mma_bf16_16816(o[dn + 1], pa, b[2], b[3]);
    }
    __syncthreads();  // this stage is overwritten by the next iteration's prefetch
  }
  ptx::cp_async_wait<0>();
  __syncthreads();

  // Merge the 4 warps' states in warp order through shared memory (reusing the stages).
  float* red_o = reinterpret_cast<float*>(smem);                  // [warp][16][kD]
  float* red_ml = red_o + kAttnWarps * 16 * kD;                    // [warp][16][2]
  float* wo = red_o + warp * 16 * kD;
#pragma unroll
  for (int dn = 0; dn < kDN; ++dn) {
    const int d = dn * 8 + 2 * t;
    wo[g * kD + d] = o[dn][0];
    wo[g * kD + d + 1] = o[dn][1];
    wo[(g + 8) * kD + d] = o[dn][2];
    wo[(g + 8) * kD + d + 1] = o[dn][3];
  }
  if (t == 0) {
    red_ml[(warp * 16 + g) * 2] = m[0];
    red_ml[(warp * 16 + g) * 2 + 1] = l[0];
    red_ml[(warp * 16 + g + 8) * 2] = m[1];
    red_ml[(warp * 16 + g + 8) * 2 + 1] = l[1];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < it.group * kD; idx += kAttnThreads) {
    const int row = idx / kD, d = idx % kD;
    float mx, sum;
    const float acc = attn_merge(kAttnWarps, [&](int w) { return red_ml[(w * 16 + row) * 2]; }, [&](int w) {
      return AttnPartial{red_ml[(w * 16 + row) * 2], red_ml[(w * 16 + row) * 2 + 1], red_o[(w * 16 + row) * kD + d]};
    }, mx, sum);
    it.o[row * it.o_row_stride + d] = acc;
    if (d == 0) {
      it.ml[row * it.ml_row_stride] = mx;
      it.ml[row * it.ml_row_stride + 1] = sum;
    }
  }
  __syncthreads();  // smem is free for the caller's next item
}

// Log-sum-exp merge of n_splits partial states of one head, in split order. Empty splits
// (m = -inf) contribute nothing; if every split is empty the output is 0.
template <int kD>
__device__ void attention_merge_head(const float* o_part, const float* ml_part, int n_splits, uint16_t* out) {
  for (int d = threadIdx.x; d < kD; d += blockDim.x) {
    float mx, sum;
    const float acc = attn_merge(n_splits, [&](int s) { return ml_part[2 * s]; }, [&](int s) {
      return AttnPartial{ml_part[2 * s], ml_part[2 * s + 1], o_part[s * kD + d]};
    }, mx, sum);
    out[d] = float_to_bf16_bits(attn_normalise(acc, sum));
  }
}

}  // namespace megadecode::cuda
