// Index math of the many-row GEMM engine (gemm.cu), shared by the kernel and the host so the CPU
// tests (tests/cuda/gemm/test_gemm_plan.cpp) check what the device computes: the tile configuration per
// token count, the work-tile numbering of dense and grouped GEMMs, the fixed split of K for dense
// GEMMs that would not fill the GPU, and the per-expert tile list of the grouped expert GEMMs.
// Plain C++ (MD_HOST_DEVICE), no CUDA types.
//
// A work tile is 128 weight rows (8 packed row blocks) x T tokens (T = 8 * token groups) over one
// range of K. Weights are the MMA's A operand in the packed layout (weight_pack.cuh); tokens the B
// operand. Sum order: every output (token, row) is one warpgroup's wgmma chain over its K range in
// increasing k (one k16 step per instruction, whatever its N), and the ranges of a split GEMM are
// added in split order: nothing depends on the token count, the tile's other tokens or the tile
// size, so results are bitwise batch-invariant.
#pragma once

#include <cstdint>

#include "core/bf16.h"

namespace megadecode::cuda::gemm {

constexpr int kTileRowBlocks = 8;                       // packed row blocks (16 rows) per tile
constexpr int kTileRows = kTileRowBlocks * 16;           // 128 weight rows
constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 1) * 32;      // + one producer warp
constexpr int kMaxTokenGroups = 16;                      // 128 tokens per tile at most
constexpr int kSplitUnitKb = 8;                          // K splits fall on multiples of 128 k
constexpr int kMaxSplits = 32;
constexpr int kMaxStages = 8;

MD_HOST_DEVICE constexpr int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// ---- tile configuration per token groups (kNT = tokens / 8 of a tile: 1, 2, 4, 8 or 16) ----
// MMAs: wgmma m64nNk16 (N = 8 kNT tokens), the A operand from registers. Consumer warp w owns
// packed row block w of the tile (16 weight rows; warpgroup w / 4 covers rows 64 (w / 4) .. + 63)
// and all the tile's tokens: each lane's 16-byte fragment of the row block feeds one wgmma.
// A pipeline stage holds kStageKb k blocks of the tile's 8 row blocks (one bulk copy per row block,
// kStageKb x 512 contiguous bytes) and of its tokens' activations: TMA boxes of 64 k x the tile's
// tokens, 128-byte swizzled (the wgmma B operand, K-major, in that swizzle: token rows of 128
// bytes, 8-row atoms of 1024 bytes), stage_kb(nt) / 4 boxes, box b at b * stage_x_box_bytes(nt).
MD_HOST_DEVICE constexpr bool valid_token_groups(int nt) { return nt == 1 || nt == 2 || nt == 4 || nt == 8 || nt == 16; }
MD_HOST_DEVICE constexpr int stage_kb(int nt) { return nt <= 8 ? 8 : 4; }
MD_HOST_DEVICE constexpr int stage_weight_bytes(int nt) { return kTileRowBlocks * stage_kb(nt) * 512; }
constexpr int kXBoxK = 64;                               // k elements of one box row (128 bytes)
constexpr int kStageAlign = 1024;                        // a 128-byte-swizzle atom
MD_HOST_DEVICE constexpr int stage_x_boxes(int nt) { return stage_kb(nt) * 16 / kXBoxK; }
MD_HOST_DEVICE constexpr int stage_x_box_bytes(int nt) { return nt * 8 * 128; }
MD_HOST_DEVICE constexpr int stage_bytes(int nt) {
  return stage_weight_bytes(nt) + stage_x_boxes(nt) * stage_x_box_bytes(nt);
}

// Token groups of a tile for a dense GEMM of n_tokens rows (one tile column when it fits).
MD_HOST_DEVICE constexpr int dense_token_groups(int n_tokens) {
  return n_tokens <= 8 ? 1 : n_tokens <= 16 ? 2 : n_tokens <= 32 ? 4 : n_tokens <= 64 ? 8 : 16;
}
// Token groups of a grouped (per-expert) GEMM's tiles, chosen from the mean rows per expert without
// the routing (which stays on the device): a tile holds about twice the mean, so an expert rarely
// needs a second tile (which would read its weights again).
MD_HOST_DEVICE constexpr int grouped_token_groups(int n_entries, int n_experts) {
  const int64_t twice_mean = (2 * static_cast<int64_t>(n_entries) + n_experts - 1) / n_experts;
  return dense_token_groups(static_cast<int>(twice_mean < 1 ? 1 : twice_mean));
}

// ---- splits of K (dense GEMMs) ----
// A dense GEMM whose row tiles would leave most SMs idle (the router: 1 tile, O-proj: 16, QKV: 40
// at the full shape) splits K into `splits` ranges of whole 128-k units; split s runs units
// [s * u / S, (s + 1) * u / S). Persistent CTAs take tiles round-robin, so the count that keeps the
// busiest SM's bytes lowest is chosen: waves(tiles * S) / S least (ties: fewer splits), each split at
// least two units. It depends on the weight shape and the SM count only (never on the tokens), so
// sums keep one order at every batch.
MD_HOST_DEVICE constexpr int k_units(int k) { return ceil_div(k, 16 * kSplitUnitKb); }
MD_HOST_DEVICE constexpr int dense_k_splits(int n_rows, int k, int n_sms) {
  const int tiles = ceil_div(n_rows, kTileRows);
  int max_s = k_units(k) / 2;
  if (max_s > kMaxSplits) max_s = kMaxSplits;
  int best = 1;
  for (int s = 2; s <= max_s; ++s)  // waves(s) / s < waves(best) / best, cross-multiplied
    if (int64_t{ceil_div(int64_t{tiles} * s, n_sms)} * best < int64_t{ceil_div(int64_t{tiles} * best, n_sms)} * s)
      best = s;
  return best;
}
struct KbRange {
  int begin, end;  // packed k blocks [begin, end)
};
MD_HOST_DEVICE constexpr KbRange split_kb_range(int split, int splits, int k) {
  const int units = k_units(k), n_kb = ceil_div(k, 16);
  const int b = static_cast<int>(int64_t{split} * units / splits) * kSplitUnitKb;
  const int e = static_cast<int>(int64_t{split + 1} * units / splits) * kSplitUnitKb;
  return {b, e < n_kb ? e : n_kb};
}

// ---- work tiles ----
// A column is a token tile (dense) or an entry of the MoE tile list (grouped, no splits). Tiles go
// in bands of `band` consecutive columns; within a band (width w: `band`, or what is left of the
// columns), t = band_start + (row_tile * splits + split) * w + (column - first column of the band).
// Consecutive tiles share their weight rows, so a matrix read by several token tiles (the LM head at
// > 128 rows) is read from HBM once and from L2 by the neighbours running beside it; the band bounds
// the activation rows the row tiles re-read, so they stay in L2 between the row tiles:
// - dense: columns of at most kBandXBytes of activation rows (dense_band);
// - grouped: one column, so a tile-list entry runs all its row tiles back to back (12 for gate/up)
//   and the expert's next entry follows in the same wave, sharing its weights through L2. With one
//   band over the whole list, each row tile walked every entry: at 128 rows per expert a 2048-token
//   piece's 67 MB of expert rows were re-read from HBM by every row tile, as many bytes as the
//   weights.
struct TileCoord {
  int row_tile, split, column;
};
MD_HOST_DEVICE constexpr TileCoord tile_coord(int t, int row_tiles, int columns, int splits, int band) {
  const int per_column = row_tiles * splits;
  const int b = t / (per_column * band), first = b * band;
  const int width = columns - first < band ? columns - first : band;
  const int r = t - b * per_column * band, rest = r / width;
  return {rest / splits, rest % splits, first + r % width};
}
constexpr int64_t kBandXBytes = int64_t{16} << 20;
MD_HOST_DEVICE constexpr int dense_band(int k, int tile_tokens) {
  const int64_t column_bytes = int64_t{tile_tokens} * k * 2;
  const int64_t band = kBandXBytes / column_bytes;
  return band < 1 ? 1 : band > (1 << 20) ? (1 << 20) : static_cast<int>(band);
}
MD_HOST_DEVICE constexpr int dense_tiles(int n_rows, int n_tokens, int token_groups, int splits) {
  return ceil_div(n_rows, kTileRows) * splits * ceil_div(n_tokens, 8 * token_groups);
}

// Token groups of a dense GEMM's tiles: the smallest tile that holds the tokens (up to 128), halved
// while the GEMM would leave more than half the SMs idle (the router: one row tile). Any tile size
// gives the same sums (see the top of this file).
MD_HOST_DEVICE constexpr int dense_tile_groups(int n_rows, int n_tokens, int splits, int n_sms) {
  int tg = dense_token_groups(n_tokens);
  while (tg > 1 && 2 * dense_tiles(n_rows, n_tokens, tg, splits) < n_sms) tg /= 2;
  return tg;
}

// ---- the per-expert tile list of a grouped GEMM ----
// One tile column of a grouped expert GEMM: expert `expert`'s slots [slot0, slot0 + n), n <= T.
struct MoeTile {
  int32_t expert;
  int32_t slot0;
  int32_t n;
  int32_t pad;
};
static_assert(sizeof(MoeTile) == 16);

// Tile columns the grouped GEMMs can need for n_entries = tokens x top_k routed rows over n_experts
// with T tokens a tile: sum_e ceil(c_e / T) <= sum_e floor(c_e / T) + #nonzero <= n / T + min(E, n).
MD_HOST_DEVICE constexpr int moe_tile_capacity(int n_entries, int n_experts, int tile_tokens) {
  return n_entries / tile_tokens + (n_experts < n_entries ? n_experts : n_entries);
}

// From per-expert counts: offsets[0..E] (exclusive prefix, offsets[E] = total) and the tile list in
// expert order; returns the number of tiles, or -1 if it would exceed `capacity` (an invariant
// violation the caller reports). The offsets are complete either way: the scatter that follows
// indexes with them, so they must never be left partly unwritten. One thread runs this (the device
// scan kernel, or the host test).
MD_HOST_DEVICE inline int build_moe_tiles(const int32_t* counts, int n_experts, int tile_tokens, int32_t* offsets,
                                          MoeTile* tiles, int capacity) {
  int off = 0, n_tiles = 0;
  bool over = false;
  for (int e = 0; e < n_experts; ++e) {
    offsets[e] = off;
    for (int s = 0; s < counts[e] && !over; s += tile_tokens) {
      if (n_tiles >= capacity) {
        over = true;
        break;
      }
      const int left = counts[e] - s;
      tiles[n_tiles++] = MoeTile{e, off + s, left < tile_tokens ? left : tile_tokens, 0};
    }
    off += counts[e];
  }
  offsets[n_experts] = off;
  return over ? -1 : n_tiles;
}

}  // namespace megadecode::cuda::gemm
