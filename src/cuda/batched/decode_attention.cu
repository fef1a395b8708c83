// Split-K paged decode attention (decode_attention.h). Kernel 1: CTA c takes items c, c + grid, ...;
// warp w of an item takes its key tiles w, w + 4, ... (16 keys each). A warp streams its own tiles
// through a private 3-deep ring with cp.async: the two tiles after the current one (possibly of
// the CTA's next item) are in flight while the current one computes, so item boundaries do not
// drain the stream. At an item's end the 4 warps' (m, l, o) merge in warp order through shared
// memory (each warp's o in the ring slot it just freed, so two CTAs fit an SM) and the item's
// partial goes to part_o / part_ml. Kernel 2 merges each row's splits in split order.
#include <cmath>
#include <mutex>

#include "core/check.h"
#include "cuda/batched/batched_plan.h"
#include "cuda/batched/decode_attention.h"
#include "cuda/common/attention_state.cuh"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_info.h"
#include "cuda/common/ptx.cuh"
#include "cuda/prefill/prefill_index.h"

namespace megadecode::cuda::batched {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 3;       // tiles per warp ring
constexpr int kCtasPerSm = 2;

template <int kD>
struct Shape {
  static constexpr int kPitch = kD * 2 + 16;  // bytes per key row: ldmatrix rows hit distinct banks
  static constexpr int kTileBytes = kKeyTile * kPitch;
  static constexpr int kSlotBytes = 2 * kTileBytes;            // K and V of one tile
  static constexpr int kWarpBytes = kStages * kSlotBytes;
  static constexpr int kMlOffset = kWarps * kWarpBytes;         // each warp's (m, l) of rows 0..7
  static constexpr int kFreeOffset = kMlOffset + kWarps * 8 * 2 * 4;  // each warp's free slot
  static constexpr int kSmemBytes = kFreeOffset + kWarps * 4;
  static_assert(8 * kD * 4 <= kSlotBytes, "a warp's o of rows 0..7 fits the slot it freed");
};

struct Item {
  int row, p, g, k0, k1;
};

__device__ __forceinline__ Item decode_item(const DecodeAttnArgs& a, int i) {
  Item it;
  it.p = i / a.n_kv_heads;
  it.g = i % a.n_kv_heads;
  it.row = split_row(a.split_begin, a.n_rows, it.p);
  const int ctx = a.seq_lens[it.row];
  const RowKeys keys = decode_row_keys(ctx, a.window);
  const SplitShape sh = decode_splits(keys.n);
  it.k0 = keys.first + (it.p - a.split_begin[it.row]) * sh.len;
  it.k1 = min(ctx, it.k0 + sh.len);
  return it;
}

// The warp's stream of tiles over the CTA's items (items where it has no tile are skipped).
struct TileCursor {
  int i, total;  // item index (>= total: the stream has ended)
  Item it;
  int key;       // first key of the current tile

  __device__ __forceinline__ void settle(const DecodeAttnArgs& a, int warp) {
    while (i < total && key >= it.k1) {
      i += gridDim.x;
      if (i < total) {
        it = decode_item(a, i);
        key = it.k0 + warp * kKeyTile;
      }
    }
  }
  __device__ __forceinline__ void start(const DecodeAttnArgs& a, int n_items, int warp) {
    total = n_items;
    i = blockIdx.x;
    key = 0;
    it.k1 = 0;
    if (i < total) {
      it = decode_item(a, i);
      key = it.k0 + warp * kKeyTile;
    }
    settle(a, warp);
  }
  __device__ __forceinline__ void next(const DecodeAttnArgs& a, int warp) {
    key += kWarps * kKeyTile;
    settle(a, warp);
  }
};

// Issues the cursor's tile (K and V of 16 keys, zero past the item's end) into `buf`; one commit.
template <int kD>
__device__ __forceinline__ void load_tile(const DecodeAttnArgs& a, const TileCursor& c, uint8_t* buf) {
  using S = Shape<kD>;
  constexpr int kChunks = kD / 8;
  const int lane = threadIdx.x & 31;
  if (c.i < c.total) {
    const int32_t* bt = a.block_tables + static_cast<int64_t>(c.it.row) * a.table_stride;
#pragma unroll
    for (int j = 0; j < (kKeyTile * kChunks) / 32; ++j) {
      const int ch = lane + 32 * j, kl = ch / kChunks, part = ch % kChunks;
      const int key = c.key + kl;
      const bool ok = key < c.it.k1;
      int64_t off = 0;
      if (ok)
        off = prefill::kv_offset(__ldg(bt + table_entry(key, a.block_size, a.ring_len)), c.it.g, key % a.block_size, part * 8, a.n_kv_heads,
                                 a.block_size, kD);
      ptx::cp_async_16(buf + kl * S::kPitch + part * 16, a.k_cache + off, ok ? 16 : 0);
      ptx::cp_async_16(buf + S::kTileBytes + kl * S::kPitch + part * 16, a.v_cache + off, ok ? 16 : 0);
    }
  }
  ptx::cp_async_commit();  // empty groups keep the wait count uniform
}

template <int kD>
__global__ void __launch_bounds__(kThreads) split_kernel(const DecodeAttnArgs a) {
  using S = Shape<kD>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g4 = lane >> 2, t4 = lane & 3;
  const int gs = a.group_size, n_heads = a.n_kv_heads * gs;
  const int n_items = a.split_begin[a.n_rows] * a.n_kv_heads;
  uint8_t* ring = smem + warp * S::kWarpBytes;
  float* red_ml = reinterpret_cast<float*>(smem + S::kMlOffset);
  int* free_slot = reinterpret_cast<int*>(smem + S::kFreeOffset);
  const float scale_log2 = attn_scale_log2(a.scale);

  TileCursor load;
  load.start(a, n_items, warp);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    load_tile<kD>(a, load, ring + s * S::kSlotBytes);
    load.next(a, warp);
  }
  uint32_t pos = 0;  // this warp's stream position
  for (int i = blockIdx.x; i < n_items; i += gridDim.x) {
    const Item it = decode_item(a, i);
    const int first = it.k0 + warp * kKeyTile;
    const int n_mine = first < it.k1 ? (it.k1 - first + kWarps * kKeyTile - 1) / (kWarps * kKeyTile) : 0;

    // q rows of the group (rows >= gs and 8..15 are zero) as the A operand.
    uint32_t qf[kD / 16][4];
    const uint16_t* qrow = a.q + (static_cast<int64_t>(it.row) * n_heads + it.g * gs + g4) * kD;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      qf[kk][0] = g4 < gs ? *reinterpret_cast<const uint32_t*>(qrow + kk * 16 + 2 * t4) : 0u;
      qf[kk][2] = g4 < gs ? *reinterpret_cast<const uint32_t*>(qrow + kk * 16 + 8 + 2 * t4) : 0u;
      qf[kk][1] = 0u;
      qf[kk][3] = 0u;
    }
    float o[kD / 8][4];
#pragma unroll
    for (int n = 0; n < kD / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int t = 0; t < n_mine; ++t, ++pos) {
      const int key0 = first + t * kWarps * kKeyTile;
      ptx::cp_async_wait<kStages - 2>();
      __syncwarp();  // this tile landed for every lane (the slot refilled next was read by all lanes)
      load_tile<kD>(a, load, ring + ((pos + kStages - 1) % kStages) * S::kSlotBytes);
      load.next(a, warp);
      const uint8_t* ks = ring + (pos % kStages) * S::kSlotBytes;
      const uint8_t* vs = ks + S::kTileBytes;

      float s[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t r[4];
        ptx::ldmatrix_x4(r, ks + ((lane >> 4) * 8 + (lane & 7)) * S::kPitch + kk * 32 + ((lane >> 3) & 1) * 16);
        ptx::mma_bf16_16816_pure(s[0], qf[kk], r[0], r[1]);
        ptx::mma_bf16_16816_pure(s[1], qf[kk], r[2], r[3]);
      }
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const AttnFragRow<2> row{s, h};
        const int kb = key0 + 2 * t4;  // score i is key kb + (i / 2) * 8 + i % 2
        const float mx =
            attn_scale_mask(row.kScores, row, scale_log2, [&](int i) { return kb + (i >> 1) * 8 + (i & 1) < it.k1; });
        alpha[h] = attn_online_step(m[h], l[h], quad_max(mx), row.kScores, row, [](float p) { return round_bf16(p); },
                                    AttnIdentity{});
      }
      const uint32_t pf[4] = {ptx::pack_bf16x2(s[0][0], s[0][1]), ptx::pack_bf16x2(s[0][2], s[0][3]),
                              ptx::pack_bf16x2(s[1][0], s[1][1]), ptx::pack_bf16x2(s[1][2], s[1][3])};
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
#pragma unroll
      for (int nd = 0; nd < kD / 16; ++nd) {
        uint32_t r[4];
        ptx::ldmatrix_x4_trans(r, vs + (((lane >> 3) & 1) * 8 + (lane & 7)) * S::kPitch + nd * 32 + (lane >> 4) * 16);
        ptx::mma_bf16_16816_pure(o[2 * nd], pf, r[0], r[1]);
        ptx::mma_bf16_16816_pure(o[2 * nd + 1], pf, r[2], r[3]);
      }
      __syncwarp();  // every lane is done with this buffer before it is refilled
    }

    // The item's end: the warps' states (rows 0..gs-1 are row g4 of the quads) merge in warp order.
    // The slot the warp's next load goes to is free until then (its tile was consumed): o goes there.
    const int mine_slot = (pos + kStages - 1) % kStages;
    l[0] = quad_sum(l[0]);
    if (g4 < gs) {
      float* mine = reinterpret_cast<float*>(ring + mine_slot * S::kSlotBytes) + g4 * kD;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        mine[n * 8 + 2 * t4] = o[n][0];
        mine[n * 8 + 2 * t4 + 1] = o[n][1];
      }
      if (t4 == 0) {
        red_ml[(warp * 8 + g4) * 2] = m[0];
        red_ml[(warp * 8 + g4) * 2 + 1] = l[0];
      }
    }
    if (lane == 0) free_slot[warp] = mine_slot;
    __syncthreads();
    for (int idx = threadIdx.x; idx < gs * kD; idx += kThreads) {
      const int r = idx / kD, d = idx % kD;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red_ml[(w * 8 + r) * 2]);
      float ov = 0.0f, lv = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float* theirs = reinterpret_cast<const float*>(smem + w * S::kWarpBytes + free_slot[w] * S::kSlotBytes);
        const float f = attn_merge_weight(red_ml[(w * 8 + r) * 2], mx);
        ov += f * theirs[r * kD + d];
        lv += f * red_ml[(w * 8 + r) * 2 + 1];
      }
      const int64_t head = static_cast<int64_t>(it.p) * n_heads + it.g * gs + r;
      a.part_o[head * kD + d] = ov;
      if (d == 0) {
        a.part_ml[head * 2] = mx;
        a.part_ml[head * 2 + 1] = lv;
      }
    }
    __syncthreads();  // the freed slots are refilled by the next item's loads
  }
  ptx::cp_async_wait<0>();  // no copy outlives the CTA
}

template <int kD>
__global__ void __launch_bounds__(kD) merge_kernel(const DecodeAttnArgs a) {
  const int row = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
  const int p0 = a.split_begin[row], n = a.split_begin[row + 1] - p0;
  const int n_heads = a.n_kv_heads * a.group_size;
  if (n == 0) {  // a padding row: zeros, so the GEMMs after read defined values
    a.out[(static_cast<int64_t>(row) * n_heads + head) * kD + d] = 0;
    return;
  }
  float m_all = 0.0f, l_all = 0.0f;
  const float o = attn_merge(
      n, [&](int i) { return a.part_ml[(static_cast<int64_t>(p0 + i) * n_heads + head) * 2]; },
      [&](int i) {
        const int64_t h = static_cast<int64_t>(p0 + i) * n_heads + head;
        return AttnPartial{a.part_ml[h * 2], a.part_ml[h * 2 + 1], a.part_o[h * kD + d]};
      },
      m_all, l_all);
  a.out[(static_cast<int64_t>(row) * n_heads + head) * kD + d] = float_to_bf16_bits(attn_normalise(o, l_all));
}

template <int kD>
void launch(const DecodeAttnArgs& a, cudaStream_t stream) {
  static std::once_flag configured;
  std::call_once(configured, [] {
    CUDA_CHECK(cudaFuncSetAttribute(split_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape<kD>::kSmemBytes));
  });
  split_kernel<kD><<<kCtasPerSm * sm_count(), kThreads, Shape<kD>::kSmemBytes, stream>>>(a);
  CUDA_CHECK_LAST();
  merge_kernel<kD><<<dim3(a.n_rows, a.n_kv_heads * a.group_size), kD, 0, stream>>>(a);
  CUDA_CHECK_LAST();
}

}  // namespace

void decode_attention(const DecodeAttnArgs& a, cudaStream_t stream) {
  MD_REQUIRE(a.head_dim == 32 || a.head_dim == 64 || a.head_dim == 128, "decode attention: head_dim ", a.head_dim,
             " not 32, 64 or 128");
  MD_REQUIRE(a.group_size >= 1 && a.group_size <= 8 && a.n_kv_heads >= 1 && a.n_kv_heads * a.group_size <= 65535,
             "decode attention: ", a.group_size, " heads per group, ", a.n_kv_heads, " groups");
  MD_REQUIRE(a.block_size >= 1 && a.table_stride >= 1 && a.scale > 0.0f && a.n_rows >= 0 && a.n_rows <= 65535,
             "decode attention: bad block size, table stride, scale or row count");
  MD_REQUIRE(a.window >= 0 && a.ring_len >= 0 && (a.ring_len == 0 || (a.window > 0 && a.table_stride >= a.ring_len &&
                                                                        a.ring_len * a.block_size > a.window)),
             "decode attention: a ring of ", a.ring_len, " blocks of ", a.block_size, " (table stride ", a.table_stride,
             ") cannot hold a window of ", a.window, " keys");
  MD_REQUIRE(a.q && a.k_cache && a.v_cache && a.block_tables && a.seq_lens && a.split_begin && a.part_o && a.part_ml &&
                 a.out,
             "decode attention: null pointer");
  if (a.n_rows == 0) return;
  switch (a.head_dim) {
    case 32: return launch<32>(a, stream);
    case 64: return launch<64>(a, stream);
    default: return launch<128>(a, stream);
  }
}

}  // namespace megadecode::cuda::batched
