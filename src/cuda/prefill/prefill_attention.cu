// Causal prefill attention on tensor cores over the paged KV cache (flash-attention style).
// CTA = (query tile, KV group) (or items of a work list: attn_work.h): 128 MMA rows = the tile's tokens x the group's heads (row r is
// token r / gs, head r % gs: the 8 query heads of a group share every K/V tile), 8 warps x 16 rows.
// Keys stream in tiles of 64 from the cache ([block][group][slot][D] pages through the block table)
// with cp.async, double-buffered; S = Q K^T and O += P V are mma.sync m16n8k16 (bf16 in, fp32
// accumulate), the softmax is online in base 2 with fp32 running max/sum per row
// (cuda/common/attention_state.cuh). Keys of a row are
// [0, its position]: earlier chunks' and this chunk's K/V (written by qk_norm_rope_store first).
// Rounding: q, K, V and P are bf16 MMA inputs; the output is bf16 like the decode path's.
#include <cmath>
#include <mutex>

#include "core/check.h"
#include "cuda/common/attention_state.cuh"
#include "cuda/common/cuda_check.h"
#include "cuda/common/ptx.cuh"
#include "cuda/prefill/prefill_kernels.h"

namespace megadecode::cuda::prefill {
namespace {

template <int kD>
struct AttnShape {
  static constexpr int kPitch = kD * 2 + 16;  // bytes per smem row: ldmatrix rows hit distinct banks
  static constexpr int kQBytes = kAttnRows * kPitch;
  static constexpr int kKvBytes = kAttnKeyTile * kPitch;  // one K or V tile
  static constexpr int kSmemBytes = kQBytes + 4 * kKvBytes;  // Q, K[2], V[2]
};

// Issues K and V of key tile `kt` into buffer `buf`: 64 keys x kD/8 chunks each, zero past key_end.
template <int kD>
__device__ __forceinline__ void load_kv(uint8_t* smem, int buf, int kt, const AttnArgs& a, int g, int key_end) {
  using S = AttnShape<kD>;
  constexpr int kChunks = kD / 8;
  uint8_t* ks = smem + S::kQBytes + buf * S::kKvBytes;
  uint8_t* vs = smem + S::kQBytes + (2 + buf) * S::kKvBytes;
  for (int c = threadIdx.x; c < kAttnKeyTile * kChunks; c += kAttnThreads) {
    const int kl = c / kChunks, part = c % kChunks;
    const int key = kt * kAttnKeyTile + kl;
    const bool ok = key < key_end;
    int64_t off = 0;
    if (ok) off = kv_offset(a.block_table[key / a.block_size], g, key % a.block_size, part * 8, a.n_kv_heads,
                            a.block_size, kD);
    ptx::cp_async_16(ks + kl * S::kPitch + part * 16, a.k_cache + off, ok ? 16 : 0);
    ptx::cp_async_16(vs + kl * S::kPitch + part * 16, a.v_cache + off, ok ? 16 : 0);
  }
}

// One CTA's work: query tile qt of KV group g, key split `split` of a.key_splits; with splits its
// unnormalised partial goes to slot part_cta of part_o / part_ml. The caller syncs before reusing smem.
template <int kD>
__device__ __forceinline__ void attend_tile(const AttnArgs& a, uint8_t* smem, int qt, int g, int split,
                                            int64_t part_cta) {
  using S = AttnShape<kD>;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
  const int gs = a.group_size, n_heads = a.n_kv_heads * gs;
  const int tq = attn_tile_tokens(gs), tok0 = qt * tq;
  const int key_end = attn_key_end(a.start_pos, a.n_tokens, qt, gs);
  // This CTA's key tiles: all of them, or split `split`'s range.
  const AttnTileRange tiles = attn_split_tiles(ceil_div(key_end, kAttnKeyTile), split, a.key_splits);
  const int kt0 = tiles.begin, n_kt = tiles.end - tiles.begin;

  // Q rows (token, head) of the tile; padding rows are zero.
  for (int c = tid; c < kAttnRows * (kD / 8); c += kAttnThreads) {
    const int r = c / (kD / 8), part = c % (kD / 8);
    const int tl = attn_row_token(r, gs);
    const bool ok = r < tq * gs && tok0 + tl < a.n_tokens;
    const uint16_t* src =
        ok ? a.q + (static_cast<int64_t>(tok0 + tl) * n_heads + g * gs + attn_row_head(r, gs)) * kD + part * 8 : a.q;
    ptx::cp_async_16(smem + r * S::kPitch + part * 16, src, ok ? 16 : 0);
  }
  if (n_kt > 0) load_kv<kD>(smem, 0, kt0, a, g, key_end);
  ptx::cp_async_commit();

  // This lane's two rows (g4, g4 + 8 of the warp's 16) and their query positions (-1: padding).
  int qpos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + g4 + 8 * h;
    const int tl = attn_row_token(r, gs);
    qpos[h] = (r < tq * gs && tok0 + tl < a.n_tokens) ? a.start_pos + tok0 + tl : -1;
  }
  const float scale_log2 = attn_scale_log2(a.scale);
  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t qf[kD / 16][4];

  for (int it = 0; it < n_kt; ++it) {
    const int kt = kt0 + it;  // buffers alternate with it
    if (it + 1 < n_kt) {
      load_kv<kD>(smem, (it + 1) & 1, kt + 1, a, g, key_end);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();  // tile kt (and Q) landed for every thread
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        ptx::ldmatrix_x4(qf[kk], smem + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * S::kPitch + kk * 32 +
                                     (lane >> 4) * 16);
    }
    const uint8_t* ks = smem + S::kQBytes + (it & 1) * S::kKvBytes;
    const uint8_t* vs = smem + S::kQBytes + (2 + (it & 1)) * S::kKvBytes;

    // S = Q K^T for 16 rows x 64 keys.
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        uint32_t r[4];
        ptx::ldmatrix_x4(r, ks + (jj * 16 + (lane >> 4) * 8 + (lane & 7)) * S::kPitch + kk * 32 + ((lane >> 3) & 1) * 16);
        ptx::mma_bf16_16816(s[2 * jj], qf[kk], r[0], r[1]);
        ptx::mma_bf16_16816(s[2 * jj + 1], qf[kk], r[2], r[3]);
      }

    // Causal mask, online softmax (base 2), P rounded to bf16 (the MMA's input; l sums the same
    // values, per lane: the quad's shares are summed once, after the last tile).
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const AttnFragRow<8> row{s, h};
      const int key0 = kt * kAttnKeyTile + 2 * t4;  // score i is key key0 + (i / 2) * 8 + i % 2
      const float mx = attn_scale_mask(row.kScores, row, scale_log2,
                                       [&](int i) { return key0 + (i >> 1) * 8 + (i & 1) <= qpos[h]; });
      // a row with no key yet: 0, not NaN
      alpha[h] = attn_online_step(m[h], l[h], quad_max(mx), row.kScores, row, [](float p) { return round_bf16(p); },
                                  AttnIdentity{});
    }
    uint32_t pf[4][4];  // P as the A operand of P V: 4 k-steps of 16 keys
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      pf[n >> 1][(n & 1) * 2] = ptx::pack_bf16x2(s[n][0], s[n][1]);
      pf[n >> 1][(n & 1) * 2 + 1] = ptx::pack_bf16x2(s[n][2], s[n][3]);
    }
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    // O += P V; V tile [key][d] read transposed as the col-major B operand.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int nd = 0; nd < kD / 16; ++nd) {
        uint32_t r[4];
        ptx::ldmatrix_x4_trans(r, vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * S::kPitch + nd * 32 +
                                      (lane >> 4) * 16);
        ptx::mma_bf16_16816(o[2 * nd], pf[kk], r[0], r[1]);
        ptx::mma_bf16_16816(o[2 * nd + 1], pf[kk], r[2], r[3]);
      }
    __syncthreads();  // buffer it & 1 is refilled by the next iteration's load
  }
  ptx::cp_async_wait<0>();  // (an empty split's Q copies) no copy outlives the CTA

  if (a.key_splits > 1) {  // this split's unnormalised partial; the merge normalises
    const int64_t cta = part_cta;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] = quad_sum(l[h]);
      const int r = warp * 16 + g4 + 8 * h;
      float* po = a.part_o + (cta * kAttnRows + r) * kD;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n)
        *reinterpret_cast<float2*>(po + n * 8 + 2 * t4) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
      if (t4 == 0) {
        a.part_ml[(cta * kAttnRows + r) * 2] = m[h];
        a.part_ml[(cta * kAttnRows + r) * 2 + 1] = l[h];
      }
    }
    return;
  }

  // Normalise and store bf16 rows [token][head * D + d].
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = quad_sum(l[h]);
    if (qpos[h] < 0) continue;
    const int r = warp * 16 + g4 + 8 * h;
    uint16_t* out = a.out + static_cast<int64_t>(tok0 + attn_row_token(r, gs)) * n_heads * kD +
                    static_cast<int64_t>(g * gs + attn_row_head(r, gs)) * kD;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n)
      *reinterpret_cast<uint32_t*>(out + n * 8 + 2 * t4) =
          ptx::pack_bf16x2(attn_normalise(o[n][2 * h], l[h]), attn_normalise(o[n][2 * h + 1], l[h]));
  }
}

// A piece's CTAs: (query tile, KV group, key split), the longest tiles first.
template <int kD>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(const AttnArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int qt = gridDim.x - 1 - blockIdx.x, g = blockIdx.y;
  attend_tile<kD>(a, smem, qt, g, blockIdx.z, (static_cast<int64_t>(qt) * a.n_kv_heads + g) * a.key_splits + blockIdx.z);
}

// Work-list mode: this CTA takes items blockIdx.x, + gridDim.x, ... of KV group blockIdx.y.
template <int kD>
__global__ void __launch_bounds__(kAttnThreads) attention_work_kernel(const AttnArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int g = blockIdx.y, n_heads = a.n_kv_heads * a.group_size, n = *a.n_work;
  for (int i = blockIdx.x; i < n; i += gridDim.x) {
    const AttnWork w = a.work[i];
    AttnArgs p = a;
    p.q = a.q + static_cast<int64_t>(w.row0) * n_heads * kD;
    p.out = a.out + static_cast<int64_t>(w.row0) * n_heads * kD;
    p.block_table = a.block_table + w.table;
    p.start_pos = w.start_pos;
    p.n_tokens = w.n_tokens;
    p.key_splits = w.splits;
    attend_tile<kD>(p, smem, w.q_tile, g, w.split, static_cast<int64_t>(w.part) * a.n_kv_heads + g);
    __syncthreads();  // the next item refills Q and the K/V buffers
  }
}

// Row (token, head)'s `splits` partials (slot(i): split i's CTA) merged in split order
// (attention_state.cuh), normalised, bf16 into out_row.
template <int kD, typename Slot>
__device__ __forceinline__ void merge_row(const AttnArgs& a, int splits, Slot slot, int r, int64_t out_row, int head) {
  const int d = threadIdx.x;
  float m_all = 0.0f, l_all = 0.0f;
  const float o = attn_merge(
      splits, [&](int i) { return a.part_ml[(slot(i) * kAttnRows + r) * 2]; },
      [&](int i) {
        const int64_t row = slot(i) * kAttnRows + r;
        return AttnPartial{a.part_ml[row * 2], a.part_ml[row * 2 + 1], a.part_o[row * kD + d]};
      },
      m_all, l_all);
  const int n_heads = a.n_kv_heads * a.group_size;
  a.out[(out_row * n_heads + head) * kD + d] = float_to_bf16_bits(attn_normalise(o, l_all));
}

template <int kD>
__global__ void __launch_bounds__(kD) merge_kernel(const AttnArgs a) {
  const int t = blockIdx.x, head = blockIdx.y;
  const int gs = a.group_size, g = head / gs, tq = attn_tile_tokens(gs), qt = t / tq;
  const int64_t cta0 = (static_cast<int64_t>(qt) * a.n_kv_heads + g) * a.key_splits;
  merge_row<kD>(a, a.key_splits, [&](int i) { return cta0 + i; }, (t - qt * tq) * gs + head % gs, t, head);
}

template <int kD>
__global__ void __launch_bounds__(kD) merge_work_kernel(const AttnArgs a) {
  const AttnMergeRow m = a.merge[blockIdx.x];
  if (m.splits <= 1) return;  // the tile wrote the row (or the row is no piece's)
  const int head = blockIdx.y, gs = a.group_size, g = head / gs;
  merge_row<kD>(a, m.splits, [&](int i) { return static_cast<int64_t>(m.part0 + i) * a.n_kv_heads + g; },
                m.tile_token * gs + head % gs, a.merge_row0 + blockIdx.x, head);
}

template <int kD>
void launch(const AttnArgs& a, cudaStream_t stream) {
  static std::once_flag configured;
  std::call_once(configured, [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    AttnShape<kD>::kSmemBytes));
    CUDA_CHECK(cudaFuncSetAttribute(attention_work_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    AttnShape<kD>::kSmemBytes));
  });
  if (a.work != nullptr) {
    attention_work_kernel<kD><<<dim3(a.work_ctas, a.n_kv_heads), kAttnThreads, AttnShape<kD>::kSmemBytes, stream>>>(a);
    CUDA_CHECK_LAST();
    if (a.merge_rows > 0) {
      merge_work_kernel<kD><<<dim3(a.merge_rows, a.n_kv_heads * a.group_size), kD, 0, stream>>>(a);
      CUDA_CHECK_LAST();
    }
    return;
  }
  const dim3 grid(attn_q_tiles(a.n_tokens, a.group_size), a.n_kv_heads, a.key_splits);
  attention_kernel<kD><<<grid, kAttnThreads, AttnShape<kD>::kSmemBytes, stream>>>(a);
  CUDA_CHECK_LAST();
  if (a.key_splits > 1) {
    merge_kernel<kD><<<dim3(a.n_tokens, a.n_kv_heads * a.group_size), kD, 0, stream>>>(a);
    CUDA_CHECK_LAST();
  }
}

}  // namespace

void attention(const AttnArgs& a, cudaStream_t stream) {
  MD_REQUIRE(a.head_dim == 32 || a.head_dim == 64 || a.head_dim == 128, "prefill attention: head_dim ", a.head_dim,
             " not 32, 64 or 128");
  MD_REQUIRE(a.group_size >= 1 && a.group_size <= 8 && a.n_kv_heads >= 1 && a.n_kv_heads <= 65535,
             "prefill attention: ", a.group_size, " heads per group, ", a.n_kv_heads, " groups");
  MD_REQUIRE(a.block_size >= 1 && a.start_pos >= 0 && a.scale > 0.0f, "prefill attention: bad block size or position");
  MD_REQUIRE(a.q && a.k_cache && a.v_cache && a.block_table && a.out, "prefill attention: null pointer");
  MD_REQUIRE(a.key_splits >= 1 && a.key_splits <= kAttnMaxKeySplits, "prefill attention: ", a.key_splits,
             " key splits outside 1..", kAttnMaxKeySplits);
  MD_REQUIRE(a.key_splits == 1 || (a.part_o && a.part_ml), "prefill attention: key splits need partial buffers");
  if (a.work != nullptr) {
    MD_REQUIRE(a.n_work && a.part_o && a.part_ml && a.work_ctas >= 1 && a.merge_rows >= 0 && a.merge_row0 >= 0 &&
                   (a.merge_rows == 0 || a.merge),
               "prefill attention: a work list needs its count, CTAs, partial buffers and merge rows");
  } else if (a.n_tokens <= 0) {
    return;
  }
  switch (a.head_dim) {
    case 32: return launch<32>(a, stream);
    case 64: return launch<64>(a, stream);
    default: return launch<128>(a, stream);
  }
}

}  // namespace megadecode::cuda::prefill
