// Index math and merge formulas of the megakernel's tensor-core attention item (attention.cuh),
// host-and-device so tests/cuda/megakernel/test_attention_tc.cpp checks them on the CPU against plain loops:
// where a position lives (the block table, or a sliding layer's ring), which KV row each lane
// copies for chunk c of split [pos_begin, pos_end), which rows are zero-filled (past the split,
// the new token), where the appended row is patched, the MMA fragment coordinates (PTX m16n8k16 /
// ldmatrix layouts) and the bf16 term split. The online softmax and the merges are
// cuda/common/attention_state.cuh's. Plain C++; no CUDA types.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/bf16.h"
#include "cuda/common/attention_state.cuh"

namespace megadecode::cuda::mk {

constexpr int kAttnMaxGroup = 8;   // q heads per KV group (MMA rows used; rows >= gs are zero)
constexpr int kAttnMaxDim = 128;   // head dim, a multiple of 16
constexpr int kAttnRows = 16;      // tokens per chunk (one warp's MMA n extent: two n8 tiles)
constexpr int kAttnWarps = 8;      // consumer warps, chunk c belongs to warp c % kAttnWarps
constexpr int kAttnPitch = kAttnMaxDim * 2 + 16;         // bytes per staged row (+16: no ldmatrix conflicts)
constexpr int kAttnStageBytes = kAttnRows * kAttnPitch;  // one of K or V of one warp
constexpr int kAttnMaxTerms = 3;   // bf16 terms q and P may be split into (tensor-core inputs)
constexpr int kAttnTerms = 2;      // what the megakernel's item uses: ~16 mantissa bits (measured as
                                   // exact as 3 terms in the routing-exact tests, and faster)

// Chunks of kAttnRows tokens covering [pos_begin, pos_end) (the last one may be partial).
MD_HOST_DEVICE inline int attn_n_chunks(int pos_begin, int pos_end) {
  return pos_end > pos_begin ? (pos_end - pos_begin + kAttnRows - 1) / kAttnRows : 0;
}

// log2 of a power of two (one instruction on the device).
MD_HOST_DEVICE inline int log2_pow2(int x) {
#if defined(__CUDA_ARCH__)
  return __ffs(x) - 1;
#else
  return __builtin_ctz(static_cast<unsigned>(x));
#endif
}

// Geometry of one item: the sequence's block table (or, for a sliding-window layer, its ring
// table), the KV group and the split. The block size bs and the head dim D are powers of two (the
// megakernel's host checks it), so the block-table path divides nothing.
// A sliding layer's item (ATTN flag kAttnSliding) has ring_len = R > 0: `bt` is the sequence's
// ring table [R] and position pos is in ring block bt[(pos / bs) % R], slot pos % bs
// (ref::KvStore::locate_ring), in the ring pool. R = kv_ring_length(W, bs) is not a power of two:
// one remainder per row on that path. (One geometry with a runtime ring_len rather than a second
// instantiation of the item: two inlined copies of the item cost the consumer loop 52 / 64 bytes of
// spills at one token group, ptxas -v.)
struct AttnGeo {
  const int32_t* bt;  // [max_blocks_per_seq] physical block of each logical block; ring: [ring_len]
  int G, group, bs, D, pos_begin, pos_end, new_pos;
  int ring_len = 0;   // 0: the block table; > 0: a sliding layer's ring of ring_len blocks

  // Entry of `bt` that holds position pos.
  MD_HOST_DEVICE int table_index(int pos) const {
    const int blk = pos >> log2_pow2(bs);
    return ring_len > 0 ? blk % ring_len : blk;
  }
  // Element offset of (pos, group, d = 0) in one layer's K (or V) cache [n_blocks][G][bs][D] (the
  // ring pool's [n_ring_blocks][G][bs][D] for a ring); K and V of a row share it.
  MD_HOST_DEVICE int64_t at(int pos) const {
    const int sb = log2_pow2(bs);
    return (((static_cast<int64_t>(bt[table_index(pos)]) * G + group) << sb) + (pos & (bs - 1))) << log2_pow2(D);
  }
  // Token of stage row `row` of chunk c.
  MD_HOST_DEVICE int token(int c, int row) const { return pos_begin + c * kAttnRows + row; }
  // Rows copied from the cache; the others are zero-filled: past the split's end (never a real
  // key of this item: another split's or noise) and the new token (patched from shared memory
  // after the append: the cache row is written in this very item).
  MD_HOST_DEVICE bool copied(int tok) const { return tok < pos_end && tok != new_pos; }
  // Stage row of chunk c that holds the new token, or -1.
  MD_HOST_DEVICE int patch_row(int c) const {
    const int r = new_pos - token(c, 0);
    return r >= 0 && r < kAttnRows && new_pos < pos_end ? r : -1;
  }
};

// The 16-byte pieces of a chunk's stage (kAttnRows rows of D / 8 pieces) a lane copies: lane l
// copies column ch of rows row0, row0 + step, ... (< kAttnRows). D / 8 divides 32, so the lanes
// cover piece i = row * (D / 8) + ch once each, lane i % 32 (tests/cuda/megakernel/test_attention_tc).
struct AttnLanePieces {
  int row0, step, ch;
};
MD_HOST_DEVICE inline AttnLanePieces attn_lane_pieces(int lane, int D) {
  const int p_shift = log2_pow2(D) - 3;  // D / 8 pieces per row
  return {lane >> p_shift, 32 >> p_shift, lane & ((1 << p_shift) - 1)};
}

// ---- MMA fragment coordinates (lane = 4 * g + t; PTX mma.m16n8k16 and ldmatrix layouts) ----
// A fragment of q (rows = q heads, k = head dim) for k16 chunk kc, register r (0..3).
struct AttnRC {
  int row, col;
};
MD_HOST_DEVICE inline AttnRC attn_qfrag_coord(int lane, int r, int kc) {
  return {(lane >> 2) + (r & 1) * 8, kc * 16 + 2 * (lane & 3) + (r >> 1) * 8};
}
// Score accumulator element e (0..3) of n8 tile nn (0..1): q row and token row of the chunk.
MD_HOST_DEVICE inline AttnRC attn_score_coord(int lane, int nn, int e) {
  return {(lane >> 2) + (e >> 1) * 8, nn * 8 + 2 * (lane & 3) + (e & 1)};
}
// Output accumulator element e of d tile dn: q row and head-dim column.
MD_HOST_DEVICE inline AttnRC attn_out_coord(int lane, int dn, int e) {
  return {(lane >> 2) + (e >> 1) * 8, dn * 8 + 2 * (lane & 3) + (e & 1)};
}
// ldmatrix.x4 row address (stage row, element column) that `lane` supplies for the K operand of
// k16 chunk kc: matrices (tokens 0-7, d +0..7), (tokens 0-7, d +8..15), (tokens 8-15, +0..7),
// (tokens 8-15, +8..15) = b0, b1 of n tile 0, then b0, b1 of n tile 1.
MD_HOST_DEVICE inline AttnRC attn_k_ldm(int lane, int kc) {
  const int lr = lane & 7, lm = lane >> 3;
  return {(lm >> 1) * 8 + lr, kc * 16 + (lm & 1) * 8};
}
// ldmatrix.x4.trans row address for the V operand of d tiles dn, dn + 1 (dn even): matrices
// (tokens 0-7, d tile dn), (tokens 8-15, dn), (tokens 0-7, dn + 1), (tokens 8-15, dn + 1).
MD_HOST_DEVICE inline AttnRC attn_v_ldm(int lane, int dn) {
  const int lr = lane & 7, lm = lane >> 3;
  return {(lm & 1) * 8 + lr, (dn + (lm >> 1)) * 8};
}

// x = sum of n bf16 terms, greedy (term i rounds what the previous ones left): n = 2 keeps ~16
// mantissa bits, n = 3 all 24 of an fp32 (what the host reference's rounding points need).
MD_HOST_DEVICE inline void attn_split_terms(float x, int n, uint16_t* terms) {
  for (int i = 0; i < kAttnMaxTerms; ++i) {
    const uint16_t b = i < n ? float_to_bf16_bits(x) : static_cast<uint16_t>(0);
    terms[i] = b;
    x -= bf16_bits_to_float(b);
  }
}

}  // namespace megadecode::cuda::mk
