// Index math of the GPU prefill path (src/cuda/prefill), shared by the kernels and the host so the
// CPU tests (tests/cuda/prefill/test_prefill_index.cpp) check what the device computes: the paged KV
// address of a position, the fused QKV and gate/up row orders of DeviceWeights, the attention
// tile's (token, head) rows, a sliding layer's window and scratch, and how a long chunk is cut. (The GEMM tiles and the per-expert tile
// list are the GEMM engine's: cuda/gemm/gemm_plan.h.) Plain C++ (MD_HOST_DEVICE), no CUDA types.
#pragma once

#include <cstdint>

#include "core/bf16.h"

namespace megadecode::cuda::prefill {

MD_HOST_DEVICE constexpr int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Fused gate/up matrix of one expert (DeviceWeights): packed row block j holds gate rows 8j..8j+7
// (block rows 0..7) then up rows 8j..8j+7 (block rows 8..15). Fused row -> intermediate column.
MD_HOST_DEVICE constexpr int swiglu_col(int fused_row) { return (fused_row / 16) * 8 + fused_row % 8; }
MD_HOST_DEVICE constexpr bool swiglu_is_up(int fused_row) { return fused_row % 16 >= 8; }

// Fused QKV output column (DeviceWeights, group-major): group g = [q heads g*gs.. | k head g | v head g].
// j < gs: q head g*gs + j; j == gs: k head g; j == gs + 1: v head g.
MD_HOST_DEVICE constexpr int qkv_col(int group, int j, int d, int group_size, int head_dim) {
  return (group * (group_size + 2) + j) * head_dim + d;
}

// Element offset of (block, kv head, slot, d) in one layer's K (or V) cache
// [n_blocks][n_kv_heads][block_size][head_dim].
MD_HOST_DEVICE constexpr int64_t kv_offset(int64_t block, int kv_head, int slot, int d, int n_kv_heads,
                                           int block_size, int head_dim) {
  return ((block * n_kv_heads + kv_head) * block_size + slot) * static_cast<int64_t>(head_dim) + d;
}

// ---- attention tiles (prefill_attention.cu) ----
constexpr int kAttnRows = 128;     // (token, head) rows per CTA: two warpgroups x 64 wgmma rows
constexpr int kAttnKeyTile = 128;  // keys per K/V tile (the wgmma N of S = Q K^T)

// Query tokens per CTA: the group's heads of each token share the CTA, so rows = tokens x heads.
MD_HOST_DEVICE constexpr int attn_tile_tokens(int group_size) { return kAttnRows / group_size; }
MD_HOST_DEVICE constexpr int attn_q_tiles(int n_tokens, int group_size) {
  return ceil_div(n_tokens, attn_tile_tokens(group_size));
}
// Row r of a tile is (token tile_token0 + r / gs, head r % gs of the group); rows past
// tokens x gs are padding (never stored).
MD_HOST_DEVICE constexpr int attn_row_token(int row, int group_size) { return row / group_size; }
MD_HOST_DEVICE constexpr int attn_row_head(int row, int group_size) { return row % group_size; }
// Keys a query tile reads: positions [0, key_end), key_end = 1 + the tile's last query position.
MD_HOST_DEVICE constexpr int attn_key_end(int start_pos, int n_tokens, int tile, int group_size) {
  const int t_end = (tile + 1) * attn_tile_tokens(group_size);
  return start_pos + (t_end < n_tokens ? t_end : n_tokens);
}

// Shared-memory layout of the wgmma attention (prefill_attention.cu): Q, K and V tiles are rows of
// 128-byte regions (64 bf16 of d each, kAttnRows or kAttnKeyTile rows a region), 128-byte swizzled
// as a TMA box with CU_TENSOR_MAP_SWIZZLE_128B writes them: 16-byte chunk c of row r sits at
// r * 128 + ((c ^ (r % 8)) * 16). Regions start on 1024-byte boundaries, so the pattern is the
// address's own (what TMA and the wgmma descriptors apply).
MD_HOST_DEVICE constexpr int attn_sw128_offset(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }
// A key tile's rows come in runs of attn_kv_run(block_size) keys that lie in one cache block
// (key tiles start at multiples of kAttnKeyTile): gcd(block_size, kAttnKeyTile).
MD_HOST_DEVICE constexpr int attn_kv_run(int block_size) {
  int a = block_size, b = kAttnKeyTile;
  while (b != 0) {
    const int t = a % b;
    a = b;
    b = t;
  }
  return a;
}
// Whole runs load as TMA boxes (64 d x run keys) when a run fills whole swizzle atoms (>= 8 rows)
// and a row is whole regions (head_dim a multiple of 64); otherwise (and for a tile's last, partial
// run) the producer warp copies rows itself.
MD_HOST_DEVICE constexpr bool attn_kv_boxes(int head_dim, int block_size) {
  return head_dim % 64 == 0 && attn_kv_run(block_size) >= 8;
}

// Key splits (a mixed step's small pieces at long positions): a piece whose CTAs (query tiles x KV
// groups) would leave the GPU idle cuts each query tile's keys into `splits` ranges of whole key
// tiles, each a CTA writing an unnormalised partial, merged after in split order. As many splits as
// bring the CTAs to about target_ctas, at most kAttnMaxKeySplits, each at least
// kAttnMinSplitTiles key tiles of the piece's longest query tile; 1 when the tiles fill it alone.
constexpr int kAttnMinSplitTiles = 4;
constexpr int kAttnMaxKeySplits = 32;
MD_HOST_DEVICE constexpr int attn_key_splits(int start_pos, int n_tokens, int group_size, int n_kv_heads,
                                             int target_ctas) {
  const int ctas = attn_q_tiles(n_tokens, group_size) * n_kv_heads;
  if (ctas <= 0 || ctas >= target_ctas) return 1;
  int s = target_ctas / ctas;
  const int by_keys = ceil_div(start_pos + n_tokens, kAttnKeyTile) / kAttnMinSplitTiles;
  if (s > by_keys) s = by_keys;
  if (s > kAttnMaxKeySplits) s = kAttnMaxKeySplits;
  return s < 1 ? 1 : s;
}
struct AttnTileRange {
  int begin, end;  // key tiles [begin, end); empty for a split past a short query tile's keys
};
// Key tiles of split `split` (of `splits`) of a query tile that reads n_kt key tiles.
MD_HOST_DEVICE constexpr AttnTileRange attn_split_tiles(int n_kt, int split, int splits) {
  const int per = ceil_div(n_kt, splits);
  const int b = split * per < n_kt ? split * per : n_kt;
  const int e = b + per < n_kt ? b + per : n_kt;
  return {b, e};
}

// ---- sliding-window layers ----
// A query at position q of a sliding layer of window W reads keys [max(0, q - W + 1), q]; a query
// tile's first key tile is the one holding the window start of its first token (start_pos + the
// tile's first token): the tiles before it are masked for every row of the tile.
MD_HOST_DEVICE constexpr int attn_key_begin_tile(int start_pos, int tile, int group_size, int window) {
  if (window <= 0) return 0;
  const int lo = start_pos + tile * attn_tile_tokens(group_size) - window + 1;
  return lo > 0 ? lo / kAttnKeyTile : 0;
}

// A prompt piece (positions [start_pos, start_pos + n_tokens)) at a sliding layer whose K/V live in
// a ring of ring_len blocks (kv/kv_cache.h: position p in ring entry (p / B) % ring_len): the ring
// cannot take the piece in place (a piece over B tokens would overwrite keys its own earlier
// queries read), so the layer runs it in a linear scratch of whole blocks: scratch position
// j = p - base holds position p, base the block start at or before the first query's window start.
// Positions [base, start_pos) are copied from the ring first (they are all still there: the ring
// holds the last ring_len blocks), the piece's K/V are written to the scratch, attention runs on
// it (positions shifted by base, the window's mask unchanged), and positions
// [write_begin, start_pos + n_tokens), those of the last ring_len blocks (distinct ring entries),
// go back to the ring.
struct SlidingPiece {
  int base;         // the scratch's first position (a multiple of block_size)
  int write_begin;  // the first position written back to the ring
  int positions;    // scratch positions used: start_pos + n_tokens - base
};
MD_HOST_DEVICE constexpr SlidingPiece sliding_piece(int start_pos, int n_tokens, int window, int block_size,
                                                    int ring_len) {
  const int lo = start_pos - window + 1;
  const int base = lo > 0 ? lo / block_size * block_size : 0;
  const int end = start_pos + n_tokens;
  const int keep = ((end - 1) / block_size - ring_len + 1) * block_size;  // the first of the last ring_len blocks
  return {base, keep > start_pos ? keep : start_pos, end - base};
}
// Scratch blocks a layer needs for pieces of up to max_tokens: the window's W - 1 earlier keys,
// up to B - 1 more back to a block start, and the piece.
MD_HOST_DEVICE constexpr int sliding_scratch_blocks(int window, int block_size, int max_tokens) {
  return ceil_div(static_cast<int64_t>(window) - 1 + block_size - 1 + max_tokens, block_size);
}

// ---- chunking (CudaBackend::prefill) ----
// Piece i of a chunk of n_tokens cut into pieces of at most max_chunk: [begin, begin + length).
MD_HOST_DEVICE constexpr int prefill_n_pieces(int n_tokens, int max_chunk) { return ceil_div(n_tokens, max_chunk); }
MD_HOST_DEVICE constexpr int prefill_piece_begin(int piece, int max_chunk) { return piece * max_chunk; }
MD_HOST_DEVICE constexpr int prefill_piece_length(int piece, int n_tokens, int max_chunk) {
  const int left = n_tokens - piece * max_chunk;
  return left < max_chunk ? left : max_chunk;
}

}  // namespace megadecode::cuda::prefill
