// Causal prefill attention over the paged KV cache on wgmma (flash-attention style, warp-specialized).
// Persistent CTAs, one an SM (the ring fills its shared memory), each of KV group blockIdx.y,
// take items (query tile, key split): a piece's in a snake over the CTAs, longest tiles first
// (grid mode), or a work list's items c, c + grid, ... (attn_work.h). A query tile is kAttnRows
// (token, head) rows: row r is token r / gs, head r % gs of the group, so the group's heads share
// every K/V tile. Three warpgroups:
// - Warpgroup 2 (the producer) gives its registers to the consumers (setmaxnreg); its four warps
//   fill a ring of kStages stages, each one key tile's K and V (kAttnKeyTile keys x head_dim,
//   128-byte swizzled regions: attn_sw128_offset). Whole runs of keys in one cache block go as TMA
//   boxes (64 d x run keys, a 3-D map over [block x group][slot][d]); the rest (a tile's last,
//   partial run, odd block sizes, head_dim 32) the warps copy themselves, then fence them to the
//   async proxy. Each warp takes every fourth box and every fourth copied piece, so a tile's 32
//   boxes (block size 16) issue from four warps at once: one warp issuing them one by one was the
//   kernel's bottleneck (ncu: the consumers waited for full stages a quarter of their time while
//   the producer never waited for an empty one). Everything completes on full[stage] (one arrival a
//   producer warp, each with its boxes' transaction bytes). Keys past a tile's causal end are never
//   read from the cache: their K rows are masked (a select, whatever the row holds) and their V
//   rows hold finite values (zeros on a stage's first use, earlier tiles' values after), so their
//   exact-zero weights add nothing.
// - Warpgroups 0 and 1 (the consumers) own rows 64 w .. 64 w + 63. Each copies its Q rows into
//   shared memory once per item, then per key tile j: issues S_j = Q K_j^T (wgmma m64n128k16, both
//   operands from shared memory) and O += P_{j-1} V_{j-1} (P from registers, V N-major through the
//   descriptor's transpose); runs the causal mask and online softmax of S_j in base 2 on the
//   accumulators (cuda/common/attention_state.cuh) while that P V runs; then waits for it,
//   releases tile j - 1's stage (empty[stage], one arrival a warp), rescales O and packs P_j in
//   bf16 (l sums the rounded weights). The two warpgroups take turns issuing their MMAs
//   (ping-pong: one's softmax runs under the other's MMAs).
// Rounding: q, K, V and P are bf16 MMA inputs, fp32 accumulation; the output is bf16 like the
// decode path's.
#include <algorithm>
#include <climits>
#include <cmath>
#include <mutex>

#include "core/check.h"
#include "cuda/common/attention_state.cuh"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_info.h"
#include "cuda/common/ptx.cuh"
#include "cuda/common/tensor_map.h"
#include "cuda/common/wgmma.cuh"
#include "cuda/prefill/prefill_kernels.h"

namespace megadecode::cuda::prefill {
namespace {

constexpr int kConsumerThreads = 256;             // two warpgroups of 64 rows
constexpr int kThreads = kConsumerThreads + 128;  // and the producer warpgroup
constexpr int kStages = 3;  // a stage is released mid-way through the next tile: two more in flight
constexpr int kConsumerWarps = kConsumerThreads / 32;
constexpr int kProducerWarps = (kThreads - kConsumerThreads) / 32;
constexpr int kProducerRegs = 72, kConsumerRegs = 216;  // 2 x 128 x 216 + 128 x 72 <= 64K
static_assert(2 * 128 * kConsumerRegs + 128 * kProducerRegs <= 65536, "register file");

template <int kD>
struct AttnShape {
  static constexpr int kDp = kD < 64 ? 64 : kD;  // d columns in shared memory (zeros past kD)
  static constexpr int kRegions = kDp / 64;      // 128-byte regions of a row
  static constexpr int kQRegion = kAttnRows * 128;
  static constexpr int kKvRegion = kAttnKeyTile * 128;
  static constexpr int kQBytes = kRegions * kQRegion;
  static constexpr int kTileBytes = kRegions * kKvRegion;  // K or V of one key tile
  static constexpr int kStageBytes = 2 * kTileBytes;        // K, then V
  static constexpr int kBarOffset = kQBytes + kStages * kStageBytes;
  static constexpr int kSmemBytes = 1024 + kBarOffset + (2 * kStages + 2) * 8;  // + alignment slack
};

// One item: query tile q_tile of a piece (its rows at q / out, its block table), KV group g, key
// split `split` of `splits` (its partial to slot part_slot when splits > 1).
struct Item {
  const uint16_t* q;
  uint16_t* out;
  const int32_t* table;
  int start_pos, n_tokens, q_tile, split, splits, g;
  int64_t part_slot;
};

// The CTA's item number idx (CTAs of KV group blockIdx.y take every gridDim.x-th item). Work mode:
// the list's items blockIdx.x + idx * gridDim.x. Grid mode: the piece's (query tile, split) pairs,
// the longest query tiles first, in a snake over the CTAs (idx even: left to right, odd: right to
// left), so each CTA's causal work sums to about the same.
template <bool kWork>
__device__ __forceinline__ bool item(const AttnArgs& a, int idx, Item& it) {
  const int n_heads = a.n_kv_heads * a.group_size, g = blockIdx.y;
  if constexpr (kWork) {
    const int i = blockIdx.x + idx * gridDim.x;
    if (i >= *a.n_work) return false;
    const AttnWork w = a.work[i];
    const int64_t row0 = static_cast<int64_t>(w.row0) * n_heads * a.head_dim;
    it = Item{a.q + row0, a.out + row0, a.block_table + w.table, w.start_pos, w.n_tokens, w.q_tile, w.split,
              w.splits, g, static_cast<int64_t>(w.part) * a.n_kv_heads + g};
    return true;
  } else {
    const int i = idx * gridDim.x + ((idx & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
    const int n_qt = attn_q_tiles(a.n_tokens, a.group_size), splits = a.key_splits;
    if (i >= n_qt * splits) return false;
    const int qt = n_qt - 1 - i / splits, split = i % splits;
    it = Item{a.q, a.out, a.block_table, a.start_pos, a.n_tokens, qt, split, splits, g,
              (static_cast<int64_t>(qt) * a.n_kv_heads + g) * splits + split};
    return true;
  }
}

// The key tiles of an item, [begin, end), and its causal end: from the key tile of the first
// token's window start (0 without a window), its split of them.
__device__ __forceinline__ AttnTileRange item_tiles(const Item& it, int group_size, int window, int& key_end) {
  key_end = attn_key_end(it.start_pos, it.n_tokens, it.q_tile, group_size);
  const int first = attn_key_begin_tile(it.start_pos, it.q_tile, group_size, window);
  AttnTileRange r = attn_split_tiles(ceil_div(key_end, kAttnKeyTile) - first, it.split, it.splits);
  r.begin += first;
  r.end += first;
  return r;
}

template <int kD, bool kWork>
__device__ __forceinline__ void produce(const AttnArgs& a, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                        int run, bool boxes, uint8_t* stages, uint64_t* full, uint64_t* empty) {
  using S = AttnShape<kD>;
  constexpr int kChunks = kD / 8;  // 16-byte pieces of a cache row
  constexpr int kThreadsP = kProducerWarps * 32;
  const int lane = threadIdx.x & 31, pw = (threadIdx.x - kConsumerThreads) >> 5;
  const int pt = pw * 32 + lane;  // this thread among the producer warps
  uint32_t ctr = 0;  // key tiles so far: stage ctr % kStages, its use ctr / kStages
  Item it;
  for (int idx = 0; item<kWork>(a, idx, it); ++idx) {
    int key_end;
    const AttnTileRange r = item_tiles(it, a.group_size, a.window, key_end);
    for (int kt = r.begin; kt < r.end; ++kt, ++ctr) {
      const int st = ctr % kStages;
      const uint32_t use = ctr / kStages;
      if (use > 0) ptx::mbar_wait(&empty[st], (use - 1) & 1);  // every consumer warp is done with it
      uint8_t* ks = stages + st * S::kStageBytes;
      uint8_t* vs = ks + S::kTileBytes;
      const int key0 = kt * kAttnKeyTile;
      const int n_valid = min(kAttnKeyTile, key_end - key0);
      const int n_runs = boxes ? n_valid / run : 0;  // whole runs: TMA boxes
      const int row0 = n_runs * run;
      if (use == 0 && n_valid < kAttnKeyTile) {  // V rows past the causal end: finite (zeros) from the start
        for (int c = pt; c < (kAttnKeyTile - n_valid) * S::kRegions * 8; c += kThreadsP) {
          const int row = n_valid + c / (S::kRegions * 8), ch = c % (S::kRegions * 8);
          *reinterpret_cast<uint4*>(vs + (ch / 8) * S::kKvRegion + attn_sw128_offset(row, ch % 8)) =
              make_uint4(0, 0, 0, 0);
        }
      }
      for (int c = pt; c < (n_valid - row0) * kChunks; c += kThreadsP) {  // the rest: copied here
        const int row = row0 + c / kChunks, ch = c % kChunks, key = key0 + row;
        const int64_t off = kv_offset(it.table[key / a.block_size], it.g, key % a.block_size, ch * 8, a.n_kv_heads,
                                      a.block_size, kD);
        const int dst = (ch / 8) * S::kKvRegion + attn_sw128_offset(row, ch % 8);
        *reinterpret_cast<uint4*>(ks + dst) = *reinterpret_cast<const uint4*>(a.k_cache + off);
        *reinterpret_cast<uint4*>(vs + dst) = *reinterpret_cast<const uint4*>(a.v_cache + off);
      }
      ptx::fence_proxy_async_shared();  // the copies, visible to the consumers' wgmma (async proxy)
      __syncwarp();
      // This warp's boxes: pw, pw + 4, ... (with two d regions, warp pw loads K or V (pw / 2) of
      // region pw % 2, a box a lane).
      const int n_boxes = n_runs * 2 * S::kRegions;
      const int mine = n_boxes > pw ? (n_boxes - pw + kProducerWarps - 1) / kProducerWarps : 0;
      if (lane == 0) ptx::mbar_arrive_expect_tx(&full[st], static_cast<uint32_t>(mine * run * 128));
      __syncwarp();
      for (int i = lane * kProducerWarps + pw; i < n_boxes; i += kThreadsP) {
        const int ri = i / (2 * S::kRegions), v = (i / S::kRegions) & 1, h = i % S::kRegions;
        const int key = key0 + ri * run;
        ptx::tma_load_3d((v ? vs : ks) + h * S::kKvRegion + ri * run * 128, v ? v_map : k_map, 64 * h,
                         key % a.block_size, it.table[key / a.block_size] * a.n_kv_heads + it.g, &full[st]);
      }
    }
  }
}

template <int kD, bool kWork>
__device__ __forceinline__ void consume(const AttnArgs& a, uint8_t* q_s, uint8_t* stages, uint64_t* full,
                                        uint64_t* empty, uint64_t* turn) {
  using S = AttnShape<kD>;
  constexpr int kNo = S::kDp / 8;  // 8-column groups of O
  const int tid = threadIdx.x, wg = tid >> 7, wt = tid & 127, warp = wt >> 5, lane = tid & 31;
  const int g4 = lane >> 2, t4 = lane & 3;
  const int gs = a.group_size, n_heads = a.n_kv_heads * gs, tq = attn_tile_tokens(gs);
  const float scale_log2 = attn_scale_log2(a.scale);
  const uint32_t q_base = ptx::smem_addr(q_s) + 64 * wg * 128;  // this warpgroup's 64 rows
  // Ping-pong: the warpgroups take turns issuing their MMAs, so one's softmax runs under the other's
  // MMAs (both read the same stages, so without turns they issue and wait in step, and the tensor
  // cores idle through both softmaxes: ncu had them busy 44 % of the time). A turn is an mbarrier
  // phase (turn[wg], one arrival from each warp of the other warpgroup); warpgroup 0 has the first.
  // Both take the same turns (the same items and tiles), so the other is never a phase ahead.
  // (Named barriers for the turns made ptxas spill ~270 bytes and serialize the wgmmas: C7512.)
  uint32_t turns = 0;  // turns this warpgroup has taken: the parity of its next wait on turn[wg]
  auto take_turn = [&] { ptx::mbar_wait(&turn[wg], turns++ & 1); };
  auto pass_turn = [&] {
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(&turn[wg ^ 1]);
  };
  if (wg == 1) pass_turn();
  uint32_t ctr = 0;
  Item it;
#pragma unroll 1
  for (int idx = 0; item<kWork>(a, idx, it); ++idx) {
    int key_end;
    const AttnTileRange r = item_tiles(it, gs, a.window, key_end);
    const int tok0 = it.q_tile * tq;
    // This warpgroup's Q rows (zeros past the tile's rows, the piece's tokens and kD). Its previous
    // item's MMAs are done (each tile waits for them), but not every warp may have seen that yet.
    ptx::named_barrier_sync(1 + wg, 128);
    for (int c = wt; c < 64 * S::kRegions * 8; c += 128) {
      const int row = 64 * wg + c / (S::kRegions * 8), ch = c % (S::kRegions * 8), tl = attn_row_token(row, gs);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row < tq * gs && tok0 + tl < it.n_tokens && ch < kD / 8)
        v = *reinterpret_cast<const uint4*>(
            it.q + (static_cast<int64_t>(tok0 + tl) * n_heads + it.g * gs + attn_row_head(row, gs)) * kD + ch * 8);
      *reinterpret_cast<uint4*>(q_s + (ch / 8) * S::kQRegion + attn_sw128_offset(row, ch % 8)) = v;
    }
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(1 + wg, 128);

    // This lane's two rows (g4, g4 + 8 of its warp's 16) and their positions (-1: padding).
    int qpos[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 64 * wg + 16 * warp + g4 + 8 * h, tl = attn_row_token(row, gs);
      qpos[h] = (row < tq * gs && tok0 + tl < it.n_tokens) ? it.start_pos + tok0 + tl : -1;
    }
    const int qmin = min(qpos[0], qpos[1]);
    // A sliding layer: the first key every row of the lane reads (keys below a row's q - window + 1
    // are masked; INT_MIN without a window).
    const int wmin = a.window > 0 ? max(qpos[0], qpos[1]) - a.window + 1 : INT_MIN;
    float o[kNo][4];
#pragma unroll
    for (int n = 0; n < kNo; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    // S = Q K^T of stage st's tile: 64 rows x kAttnKeyTile keys, k16 steps over d (issued, not waited).
    float sc[kAttnKeyTile / 8][4];
    uint32_t pf[kAttnKeyTile / 16][4];  // P as the A operand of P V: k16 steps of keys
    auto issue_qk = [&](int st) {
      const uint32_t k_base = ptx::smem_addr(stages + st * S::kStageBytes);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < S::kDp / 16; ++kk) {
        const uint32_t step = (kk % 4) * 32;  // the k16 step within a 64-d region
        ptx::wgmma_bf16_ss<kAttnKeyTile / 8>(sc, ptx::wgmma_desc_sw128(q_base + (kk / 4) * S::kQRegion + step),
                                             ptx::wgmma_desc_sw128(k_base + (kk / 4) * S::kKvRegion + step), kk > 0);
      }
      ptx::wgmma_commit();
    };
    // O += P V of stage st's tile: V's rows are keys (k), its 64-d regions the N extent (LBO apart).
    auto issue_pv = [&](int st) {
      const uint32_t v_base = ptx::smem_addr(stages + st * S::kStageBytes) + S::kTileBytes;
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kAttnKeyTile / 16; ++kk)
        ptx::wgmma_bf16_rs_tb<kNo>(o, pf[kk], ptx::wgmma_desc_b_mn_sw128(v_base + kk * 2048, S::kKvRegion), 1);
      ptx::wgmma_commit();
    };
    // Causal mask and a sliding layer's window (only where a key may fall outside a row's range) and
    // the online softmax of tile kt:
    // sc becomes the weights 2^(s - m) (flushing below 2^-126 to zero); returns each row's rescale
    // of O and of l.
    auto softmax = [&](int kt, float (&alpha)[2]) {
      const int key0 = kt * kAttnKeyTile;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const AttnFragRow<kAttnKeyTile / 8> row{sc, h};
        // The max of the raw scores, scaled once (scale_log2 > 0: the same max as of the scaled
        // ones); each weight is then 2^(s * scale - m) in one fused multiply-add.
        float mx = -INFINITY;
        if (key0 + kAttnKeyTile - 1 <= qmin && key0 >= wmin) {
#pragma unroll
          for (int i = 0; i < row.kScores; ++i) mx = fmaxf(mx, row(i));
        } else {
          const int kb = key0 + 2 * t4;  // score i is key kb + (i / 2) * 8 + i % 2
          const int lo = a.window > 0 ? qpos[h] - a.window + 1 : INT_MIN;  // the row's window start
#pragma unroll
          for (int i = 0; i < row.kScores; ++i) {
            const int key = kb + (i >> 1) * 8 + (i & 1);
            if (key > qpos[h] || key < lo) row(i) = -INFINITY;
            mx = fmaxf(mx, row(i));
          }
        }
        const AttnRescale rs = attn_rescale(m[h], quad_max(mx) * scale_log2);
#pragma unroll
        for (int i = 0; i < row.kScores; ++i) row(i) = ptx::exp2_ftz(fmaf(row(i), scale_log2, -rs.m_use));
        alpha[h] = rs.alpha;
      }
    };
    // The weights to bf16 pairs, the A fragments of P V (chunk n's row h pair is pf[n / 2][2 (n % 2)
    // + h]); l = l * alpha + the rounded weights summed in key order (attn_online_step's arithmetic
    // with bf16 rounding, one conversion a pair). Only after the previous P V is done: pf is its input.
    auto pack_p = [&](const float (&alpha)[2]) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < kAttnKeyTile / 8; ++n) {
          const uint32_t pair = ptx::pack_bf16x2(sc[n][2 * h], sc[n][2 * h + 1]);
          sum += __uint_as_float(pair << 16);
          sum += __uint_as_float(pair & 0xffff0000u);
          pf[n >> 1][(n & 1) * 2 + h] = pair;
        }
        l[h] = l[h] * alpha[h] + sum;
      }
    };
    auto release = [&](int st) {  // this warp no longer reads the stage
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(&empty[st]);
    };

    // Tile j's softmax runs while the tensor cores do P V of tile j - 1: per tile, issue Q K_j^T, then
    // P_{j-1} V_{j-1}; wait for the older group (S_j), softmax; wait for P V, release tile j - 1's
    // stage, rescale O and pack P_j. (wgmma groups complete in order; nothing touches pf or o while
    // a P V reads or writes them, nor sc while a Q K^T writes it.)
    if (r.end > r.begin) {
      int st = ctr % kStages;
      ptx::mbar_wait(&full[st], (ctr / kStages) & 1);
      take_turn();
      issue_qk(st);
      pass_turn();
      ptx::wgmma_wait<0>();
      ptx::wgmma_fence_operands(sc);
      float alpha[2];
      softmax(r.begin, alpha);  // O is still zero
      pack_p(alpha);
#pragma unroll 1
      for (int kt = r.begin + 1; kt < r.end; ++kt) {
        const int prev = st;
        ++ctr;
        st = ctr % kStages;
        ptx::mbar_wait(&full[st], (ctr / kStages) & 1);
        take_turn();
        issue_qk(st);
        issue_pv(prev);
        pass_turn();
        ptx::wgmma_wait<1>();
        ptx::wgmma_fence_operands(sc);
        softmax(kt, alpha);
        ptx::wgmma_wait<0>();
        ptx::wgmma_fence_operands(o);
        release(prev);
#pragma unroll
        for (int n = 0; n < kNo; ++n) {
          o[n][0] *= alpha[0];
          o[n][1] *= alpha[0];
          o[n][2] *= alpha[1];
          o[n][3] *= alpha[1];
        }
        pack_p(alpha);
      }
      take_turn();
      issue_pv(st);
      pass_turn();
      ptx::wgmma_wait<0>();
      ptx::wgmma_fence_operands(o);
      release(st);
      ++ctr;
    }

    if (it.splits > 1) {  // this split's unnormalised partial; the merge normalises
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l[h] = quad_sum(l[h]);
        const int row = 64 * wg + 16 * warp + g4 + 8 * h;
        float* po = a.part_o + (it.part_slot * kAttnRows + row) * kD;
#pragma unroll
        for (int n = 0; n < kD / 8; ++n)
          *reinterpret_cast<float2*>(po + n * 8 + 2 * t4) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
        if (t4 == 0) {
          a.part_ml[(it.part_slot * kAttnRows + row) * 2] = m[h];
          a.part_ml[(it.part_slot * kAttnRows + row) * 2 + 1] = l[h];
        }
      }
      continue;
    }
    // Normalise and store bf16 rows [token][head * D + d].
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] = quad_sum(l[h]);
      if (qpos[h] < 0) continue;
      const int row = 64 * wg + 16 * warp + g4 + 8 * h;
      uint16_t* out = it.out + static_cast<int64_t>(tok0 + attn_row_token(row, gs)) * n_heads * kD +
                      static_cast<int64_t>(it.g * gs + attn_row_head(row, gs)) * kD;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n)
        *reinterpret_cast<uint32_t*>(out + n * 8 + 2 * t4) =
            ptx::pack_bf16x2(attn_normalise(o[n][2 * h], l[h]), attn_normalise(o[n][2 * h + 1], l[h]));
    }
  }
}

template <int kD, bool kWork>
__global__ void __launch_bounds__(kThreads, 1)
    attention_kernel(const AttnArgs a, const __grid_constant__ CUtensorMap k_map,
                     const __grid_constant__ CUtensorMap v_map, int run, int boxes) {
  using S = AttnShape<kD>;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);  // swizzle atoms
  uint8_t* stages = smem + S::kQBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBarOffset);
  uint64_t* empty = full + kStages;
  uint64_t* turn = empty + kStages;  // the consumer warpgroups' turns to issue MMAs (one arrival a warp of the other)
  if constexpr (kD < 64) {  // d past kD is never copied: zeros (0 x a stale NaN would reach S)
    for (int i = threadIdx.x; i < kStages * S::kStageBytes / 16; i += kThreads)
      reinterpret_cast<uint4*>(stages)[i] = make_uint4(0, 0, 0, 0);
    ptx::fence_proxy_async_shared();
  }
  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) {
      ptx::mbar_init(&full[st], kProducerWarps);
      ptx::mbar_init(&empty[st], kConsumerWarps);
    }
    ptx::mbar_init(&turn[0], kConsumerWarps / 2);
    ptx::mbar_init(&turn[1], kConsumerWarps / 2);
    ptx::fence_mbar_init();
  }
  if (threadIdx.x == kConsumerThreads && boxes) {
    ptx::prefetch_tensormap(&k_map);
    ptx::prefetch_tensormap(&v_map);
  }
  __syncthreads();
  if (threadIdx.x >= kConsumerThreads) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    produce<kD, kWork>(a, &k_map, &v_map, run, boxes != 0, stages, full, empty);
  } else {
    ptx::setmaxnreg_inc<kConsumerRegs>();
    consume<kD, kWork>(a, smem, stages, full, empty, turn);
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
  using S = AttnShape<kD>;
  static std::once_flag configured;
  std::call_once(configured, [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<kD, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    S::kSmemBytes));
    CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<kD, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    S::kSmemBytes));
  });
  const int run = attn_kv_run(a.block_size);
  const bool boxes = attn_kv_boxes(kD, a.block_size);
  CUtensorMap k_map{}, v_map{};
  if (boxes) {  // [block x group][slot][d], boxes of 64 d x run slots
    const uint64_t dims[3] = {static_cast<uint64_t>(kD), static_cast<uint64_t>(a.block_size),
                              static_cast<uint64_t>(a.kv_blocks) * a.n_kv_heads};
    const uint64_t strides[2] = {static_cast<uint64_t>(kD) * 2, static_cast<uint64_t>(a.block_size) * kD * 2};
    const uint32_t box[3] = {64, static_cast<uint32_t>(run), 1};
    k_map = bf16_tensor_map_sw128(a.k_cache, 3, dims, strides, box, "prefill attention K cache");
    v_map = bf16_tensor_map_sw128(a.v_cache, 3, dims, strides, box, "prefill attention V cache");
  }
  if (a.work != nullptr) {
    attention_kernel<kD, true><<<dim3(a.work_ctas, a.n_kv_heads), kThreads, S::kSmemBytes, stream>>>(
        a, k_map, v_map, run, boxes);
    CUDA_CHECK_LAST();
    if (a.merge_rows > 0) {
      merge_work_kernel<kD><<<dim3(a.merge_rows, a.n_kv_heads * a.group_size), kD, 0, stream>>>(a);
      CUDA_CHECK_LAST();
    }
    return;
  }
  // One CTA an SM (the ring fills shared memory), items spread over them (item<false>).
  const int items = attn_q_tiles(a.n_tokens, a.group_size) * a.key_splits;
  const dim3 grid(std::min(items, std::max(1, sm_count() / a.n_kv_heads)), a.n_kv_heads);
  attention_kernel<kD, false><<<grid, kThreads, S::kSmemBytes, stream>>>(a, k_map, v_map, run, boxes);
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
  MD_REQUIRE(a.kv_blocks >= 1, "prefill attention: the cache's block count (kv_blocks) is needed");
  MD_REQUIRE(a.key_splits >= 1 && a.key_splits <= kAttnMaxKeySplits, "prefill attention: ", a.key_splits,
             " key splits outside 1..", kAttnMaxKeySplits);
  MD_REQUIRE(a.key_splits == 1 || (a.part_o && a.part_ml), "prefill attention: key splits need partial buffers");
  MD_REQUIRE(a.window >= 0 && (a.window == 0 || a.work == nullptr),
             "prefill attention: a window (", a.window, ") in grid mode only");
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
