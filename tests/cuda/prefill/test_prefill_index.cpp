// CPU tests of the GPU prefill path's index math (src/cuda/prefill/prefill_index.h): the fused
// row orders DeviceWeights builds, the paged KV address, the attention tile rows and the cutting of
// a chunk into pieces, and a sliding layer's window tiles and scratch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "cuda/prefill/attn_work.h"
#include "cuda/prefill/prefill_index.h"

namespace megadecode::cuda::prefill {
namespace {

// DeviceWeights interleaves gate/up per 8 rows: fused row block j = gate rows 8j..8j+7, up rows 8j..8j+7.
TEST(PrefillIndex, SwiGluColumnsMirrorTheInterleave) {
  for (int inter : {16, 64, 768}) {
    std::vector<int> fused_src(2 * inter), fused_up(2 * inter);  // source row and matrix of each fused row
    for (int j = 0; j < inter / 8; ++j)
      for (int i = 0; i < 8; ++i) {
        fused_src[16 * j + i] = 8 * j + i;
        fused_up[16 * j + i] = 0;
        fused_src[16 * j + 8 + i] = 8 * j + i;
        fused_up[16 * j + 8 + i] = 1;
      }
    for (int r = 0; r < 2 * inter; ++r) {
      EXPECT_EQ(swiglu_col(r), fused_src[r]) << "row " << r;
      EXPECT_EQ(swiglu_is_up(r), fused_up[r] == 1) << "row " << r;
    }
  }
}

// Fused QKV rows are group-major [q heads of g | k head g | v head g]; qkv_col is a bijection.
TEST(PrefillIndex, QkvColumnsAreGroupMajor) {
  for (auto [G, gs, D] : {std::tuple{4, 8, 128}, std::tuple{2, 4, 32}, std::tuple{3, 1, 64}}) {
    std::vector<int> seen(G * (gs + 2) * D, 0);
    int expect = 0;
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < gs + 2; ++j)
        for (int d = 0; d < D; ++d) {
          const int col = qkv_col(g, j, d, gs, D);
          ASSERT_EQ(col, expect++);  // increasing in (g, j, d) order: the cudaMemcpy2D layout
          ++seen[col];
        }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int v) { return v == 1; }));
  }
}

TEST(PrefillIndex, KvOffsetMatchesTheCacheLayout) {
  const int G = 3, bs = 5, D = 32, n_blocks = 7;
  std::vector<int> seen(n_blocks * G * bs * D, 0);
  for (int b = 0; b < n_blocks; ++b)
    for (int g = 0; g < G; ++g)
      for (int s = 0; s < bs; ++s)
        for (int d = 0; d < D; ++d) {
          const int64_t o = kv_offset(b, g, s, d, G, bs, D);
          ASSERT_EQ(o, (((static_cast<int64_t>(b) * G + g) * bs + s) * D + d));
          ++seen[o];
        }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int v) { return v == 1; }));
}

// Every (token, head) of a chunk is exactly one row of one tile; each row's keys [0, pos] lie
// inside the tile's key range, and the range ends at the tile's last position.
TEST(PrefillIndex, AttentionTilesCoverTokensAndHeads) {
  for (int gs : {1, 2, 3, 4, 5, 8})
    for (int n : {1, 15, 16, 17, 128, 1000})
      for (int start : {0, 3, 512}) {
        std::vector<int> seen(static_cast<size_t>(n) * gs, 0);
        const int tq = attn_tile_tokens(gs);
        ASSERT_GE(tq * gs, 1);
        ASSERT_LE(tq * gs, kAttnRows);
        for (int tile = 0; tile < attn_q_tiles(n, gs); ++tile) {
          int last_pos = -1;
          for (int r = 0; r < tq * gs; ++r) {
            const int t = tile * tq + attn_row_token(r, gs);
            if (t >= n) continue;
            ++seen[static_cast<size_t>(t) * gs + attn_row_head(r, gs)];
            last_pos = std::max(last_pos, start + t);
          }
          ASSERT_GE(last_pos, 0) << "empty tile";
          EXPECT_EQ(attn_key_end(start, n, tile, gs), last_pos + 1) << "gs " << gs << " n " << n << " tile " << tile;
        }
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int v) { return v == 1; })) << "gs " << gs << " n " << n;
      }
}

// Key splits: 1 when the query tiles fill the target alone; otherwise CTAs within the target (the
// partial buffers are sized by it), each split at least kAttnMinSplitTiles key tiles of the longest
// query tile, and the splits of every query tile cover its key tiles once, in order.
// The wgmma attention's shared layout: each row keeps its own 128 bytes, its 8 chunks permuted (so
// the region's bytes are covered once), and the permutation repeats every 8 rows (1024 bytes, the
// swizzle atom TMA and the descriptors assume).
TEST(PrefillIndex, Sw128OffsetsPermuteChunksWithinEachRow) {
  std::vector<int> hits(kAttnKeyTile * 128 / 16, 0);
  for (int row = 0; row < kAttnKeyTile; ++row)
    for (int ch = 0; ch < 8; ++ch) {
      const int off = attn_sw128_offset(row, ch);
      ASSERT_EQ(off % 16, 0);
      ASSERT_EQ(off / 128, row) << "row " << row << " chunk " << ch;
      ++hits[off / 16];
      EXPECT_EQ(attn_sw128_offset(row + 8, ch) - off, 1024);
    }
  for (int h : hits) EXPECT_EQ(h, 1);
  EXPECT_EQ(attn_sw128_offset(0, 5), 80);   // row 0: unswizzled
  EXPECT_EQ(attn_sw128_offset(3, 5), 3 * 128 + (5 ^ 3) * 16);
}

// Runs of keys in one block: every run of a key tile starts at a multiple of the run and stays in
// its block, for any block size; boxes only where a run fills whole 8-row atoms and rows whole regions.
TEST(PrefillIndex, KvRunsStayInsideOneBlock) {
  for (int bs : {1, 5, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 384, 1024}) {
    const int run = attn_kv_run(bs);
    ASSERT_GE(run, 1);
    EXPECT_EQ(bs % run, 0) << bs;
    EXPECT_EQ(kAttnKeyTile % run, 0) << bs;
    for (int kt = 0; kt < 12; ++kt)
      for (int key = kt * kAttnKeyTile; key < (kt + 1) * kAttnKeyTile; key += run)
        ASSERT_EQ(key / bs, (key + run - 1) / bs) << "block size " << bs << " key " << key;
    EXPECT_EQ(attn_kv_boxes(128, bs), run >= 8) << bs;
    EXPECT_FALSE(attn_kv_boxes(32, bs));
  }
  EXPECT_EQ(attn_kv_run(16), 16);
  EXPECT_EQ(attn_kv_run(384), 128);
  EXPECT_EQ(attn_kv_run(12), 4);
}

TEST(PrefillIndex, KeySplitsStayWithinTheTargetAndCoverEveryKeyTileOnce) {
  constexpr int kTarget = 264;
  EXPECT_EQ(attn_key_splits(0, 2048, 8, 4, kTarget), 1) << "128 tiles x 4 groups fill it";
  EXPECT_EQ(attn_key_splits(20000, 16, 8, 4, kTarget), kAttnMaxKeySplits) << "one tile a group, 20K keys";
  EXPECT_EQ(attn_key_splits(10000, 16, 8, 4, kTarget), 10016 / kAttnKeyTile / kAttnMinSplitTiles)
      << "10K keys: splits of at least kAttnMinSplitTiles key tiles";
  EXPECT_EQ(attn_key_splits(0, 16, 8, 4, kTarget), 1) << "16 keys: nothing to split";
  EXPECT_EQ(attn_key_splits(200, 100, 8, 4, kTarget), 1) << "3 key tiles: under two splits' minimum";
  for (int start : {0, 1, 255, 256, 1000, 4097, 16000})
    for (int n : {1, 7, 16, 17, 100, 500, 768})
      for (int gs : {1, 4, 8}) {
        const int splits = attn_key_splits(start, n, gs, 4, kTarget);
        ASSERT_GE(splits, 1);
        ASSERT_LE(splits, kAttnMaxKeySplits);
        if (splits > 1) {
          EXPECT_LE(attn_q_tiles(n, gs) * 4 * splits, kTarget) << start << " " << n << " " << gs;
          EXPECT_GE(ceil_div(start + n, kAttnKeyTile), splits * kAttnMinSplitTiles);
        }
        for (int qt = 0; qt < attn_q_tiles(n, gs); ++qt) {
          const int n_kt = ceil_div(attn_key_end(start, n, qt, gs), kAttnKeyTile);
          int next = 0;
          for (int z = 0; z < splits; ++z) {
            const AttnTileRange r = attn_split_tiles(n_kt, z, splits);
            ASSERT_EQ(r.begin, next) << "split " << z << " of " << splits;
            ASSERT_GE(r.end, r.begin);
            next = r.end;
          }
          ASSERT_EQ(next, n_kt);
          ASSERT_GE(attn_split_tiles(n_kt, 0, splits).end, 1) << "split 0 always has keys";
        }
      }
}

// A mixed step's work list (attn_work.h), for random pieces: within attn_work_capacity; every
// (piece, query tile, key tile) in exactly one item; split items' slots distinct and below the
// target (the partial buffers' size); each piece row's merge names its tile's splits, slot part0
// + i being split i; rows of no piece merge nothing; the longest key ranges first.
TEST(PrefillIndex, WorkListCoversEveryPieceTileOnceWithinItsBounds) {
  const uint64_t seed = 0x3a7c0ffee5eedull;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  int split_trials = 0, multi_piece_trials = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int gs = std::vector<int>{1, 4, 8}[rng.below(3)], G = 1 + static_cast<int>(rng.below(8));
    const int target = 1 + static_cast<int>(rng.below(300));
    const int row0 = 8 * static_cast<int>(rng.below(9)), prompt_cap = 1 + static_cast<int>(rng.below(700));
    std::vector<AttnPieceDesc> pieces;
    int rows = 0, table = 0;
    while (rows < prompt_cap && (pieces.empty() || rng.below(3) != 0)) {
      const int n = 1 + static_cast<int>(rng.below(std::min<uint64_t>(prompt_cap - rows, rng.below(2) ? 24 : 700)));
      const int start = static_cast<int>(rng.below(rng.below(2) ? 64 : 20000));
      pieces.push_back({row0 + rows, n, start, table});
      rows += n;
      table += start + n;  // any distinct offsets
    }
    const int cap = attn_work_capacity(prompt_cap, gs, G, target);
    std::vector<AttnWork> work(cap);
    std::vector<AttnMergeRow> merge(prompt_cap + 3, AttnMergeRow{-7, -7, -7});
    const int n_items = attn_work_list(pieces, gs, G, target, row0, work, merge);
    ASSERT_LE(n_items, cap);
    std::map<std::tuple<int, int, int>, int> covered;  // (piece, q tile, key tile) -> items
    std::set<int> slots;
    std::map<std::pair<int, int>, std::vector<int>> tile_parts;  // (piece, q tile) -> parts by split
    int prev_len = 1 << 30;
    for (int i = 0; i < n_items; ++i) {
      const AttnWork& w = work[i];
      const auto it = std::find_if(pieces.begin(), pieces.end(), [&](const AttnPieceDesc& p) { return p.row0 == w.row0; });
      ASSERT_NE(it, pieces.end());
      const int p = static_cast<int>(it - pieces.begin());
      ASSERT_EQ(w.start_pos, it->start_pos);
      ASSERT_EQ(w.n_tokens, it->n_tokens);
      ASSERT_EQ(w.table, it->table);
      ASSERT_EQ(w.splits, attn_key_splits(it->start_pos, it->n_tokens, gs, G, std::max(1, target / int(pieces.size()))));
      ASSERT_LT(w.q_tile, attn_q_tiles(w.n_tokens, gs));
      const int n_kt = ceil_div(attn_key_end(w.start_pos, w.n_tokens, w.q_tile, gs), kAttnKeyTile);
      const AttnTileRange r = attn_split_tiles(n_kt, w.split, w.splits);
      EXPECT_LE(r.end - r.begin, prev_len) << "item " << i << ": not the longest first";
      prev_len = r.end - r.begin;
      for (int kt = r.begin; kt < r.end; ++kt) ++covered[{p, w.q_tile, kt}];
      if (w.splits > 1) {
        for (int g = 0; g < G; ++g) {
          const int slot = w.part * G + g;
          ASSERT_LT(slot, target);
          ASSERT_GE(slot, 0);
          ASSERT_TRUE(slots.insert(slot).second) << "slot " << slot << " twice";
        }
        auto& parts = tile_parts[{p, w.q_tile}];
        parts.resize(w.splits, -1);
        parts[w.split] = w.part;
      }
    }
    for (size_t p = 0; p < pieces.size(); ++p)
      for (int qt = 0; qt < attn_q_tiles(pieces[p].n_tokens, gs); ++qt) {
        const int n_kt = ceil_div(attn_key_end(pieces[p].start_pos, pieces[p].n_tokens, qt, gs), kAttnKeyTile);
        for (int kt = 0; kt < n_kt; ++kt)
          ASSERT_EQ((covered[{static_cast<int>(p), qt, kt}]), 1) << "piece " << p << " tile " << qt << " key tile " << kt;
      }
    EXPECT_EQ(covered.size(), [&] {
      size_t want = 0;
      for (const AttnPieceDesc& pc : pieces)
        for (int qt = 0; qt < attn_q_tiles(pc.n_tokens, gs); ++qt)
          want += ceil_div(attn_key_end(pc.start_pos, pc.n_tokens, qt, gs), kAttnKeyTile);
      return want;
    }()) << "key tiles outside every piece";
    split_trials += !slots.empty();
    multi_piece_trials += pieces.size() > 1;
    std::vector<bool> in_piece(merge.size(), false);
    for (size_t p = 0; p < pieces.size(); ++p)
      for (int t = 0; t < pieces[p].n_tokens; ++t) {
        const int row = pieces[p].row0 + t - row0;
        in_piece[row] = true;
        const int qt = t / attn_tile_tokens(gs);
        const AttnMergeRow& m = merge[row];
        ASSERT_EQ(m.tile_token, t - qt * attn_tile_tokens(gs));
        const auto found = tile_parts.find({static_cast<int>(p), qt});
        if (found == tile_parts.end()) {
          ASSERT_LE(m.splits, 1) << "row " << row << " merges a tile that did not split";
          continue;
        }
        ASSERT_EQ(m.splits, static_cast<int>(found->second.size()));
        for (int i = 0; i < m.splits; ++i) ASSERT_EQ(found->second[i], m.part0 + i) << "row " << row << " split " << i;
      }
    for (size_t row = 0; row < merge.size(); ++row) {
      if (!in_piece[row]) {
        EXPECT_EQ(merge[row].splits, 0) << "row " << row << " of no piece";
      }
    }
  }
  EXPECT_GE(split_trials, 40) << "too few trials split keys";
  EXPECT_GE(multi_piece_trials, 40) << "too few trials had several pieces";
  // Too small a list or merge range is an error, not an overrun.
  const AttnPieceDesc big{0, 500, 0, 0};
  std::vector<AttnWork> two(2);
  std::vector<AttnMergeRow> merge(500);
  EXPECT_THROW(attn_work_list(std::span(&big, 1), 8, 4, 264, 0, two, merge), Error);
  std::vector<AttnWork> enough(attn_work_capacity(500, 8, 4, 264));
  EXPECT_THROW(attn_work_list(std::span(&big, 1), 8, 4, 264, 0, enough, std::span(merge).first(499)), Error);
}

TEST(PrefillIndex, PiecesCoverTheChunkInOrder) {
  for (int chunk : {1, 7, 512, 2048})
    for (int n : {1, 6, 7, 8, 511, 512, 513, 2500, 4096}) {
      int covered = 0;
      for (int i = 0; i < prefill_n_pieces(n, chunk); ++i) {
        EXPECT_EQ(prefill_piece_begin(i, chunk), covered);
        const int len = prefill_piece_length(i, n, chunk);
        EXPECT_GE(len, 1);
        EXPECT_LE(len, chunk);
        covered += len;
      }
      EXPECT_EQ(covered, n) << "chunk " << chunk << " n " << n;
    }
}

}  // namespace
}  // namespace megadecode::cuda::prefill

namespace megadecode::cuda::prefill {
namespace {

// A sliding layer's query tile starts at the key tile of its first token's window start: every key
// of the tiles before it lies below every row's window, and the tile range still reaches each row's
// own window start (the rows after the first start later, never earlier).
TEST(PrefillIndex, WindowKeyTilesStartAtTheFirstRowsWindow) {
  const uint64_t seed = 0x51d1e5eedull;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int trial = 0; trial < 2000; ++trial) {
    const int gs = 1 << rng.below(4), window = 1 + static_cast<int>(rng.below(5000));
    const int start = static_cast<int>(rng.below(20000)), n = 1 + static_cast<int>(rng.below(3000));
    for (int qt = 0; qt < attn_q_tiles(n, gs); ++qt) {
      const int b = attn_key_begin_tile(start, qt, gs, window);
      const int first_q = start + qt * attn_tile_tokens(gs);
      const int lo = std::max(0, first_q - window + 1);
      ASSERT_LE(b * kAttnKeyTile, lo) << "the first tile starts at or before the first row's window";
      ASSERT_GT((b + 1) * kAttnKeyTile, lo) << "and holds it: the tiles before are wholly masked";
      ASSERT_LE(b * kAttnKeyTile, attn_key_end(start, n, qt, gs) - 1);
    }
    ASSERT_EQ(attn_key_begin_tile(start, 3, gs, 0), 0) << "no window: every tile from 0";
  }
}

// Pieces of random sizes through a ring of R = ceil(W / B) + 1 blocks, each run as sliding_piece
// says, the ring simulated slot by slot (each slot records the position it holds): before a piece,
// every position it copies to the scratch ([base, start)) is in the ring at its entry; the scratch
// fits sliding_scratch_blocks; the write-back touches distinct slots; and after it, every position
// a later query reads (the last W) is in the ring, so decode steps and later pieces find them.
TEST(PrefillIndex, SlidingPiecesKeepTheRingsWindow) {
  const uint64_t seed = 0x0121e5eedull;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const int B = 1 + static_cast<int>(rng.below(20)), W = 1 + static_cast<int>(rng.below(300));
    const int R = (W + B - 1) / B + 1, max_piece = 1 + static_cast<int>(rng.below(700));
    std::vector<int> ring(static_cast<size_t>(R) * B, -1);  // the position each slot holds
    auto slot = [&](int p) { return static_cast<size_t>((p / B) % R) * B + p % B; };
    int pos = 0;
    for (int piece = 0; piece < 8; ++piece) {
      const int n = 1 + static_cast<int>(rng.below(max_piece));
      const SlidingPiece sp = sliding_piece(pos, n, W, B, R);
      ASSERT_EQ(sp.base % B, 0);
      ASSERT_LE(sp.base, std::max(0, pos - W + 1)) << "the first query's window is in the scratch";
      ASSERT_GE(sp.base, 0);
      ASSERT_EQ(sp.positions, pos + n - sp.base);
      ASSERT_LE(sp.positions, sliding_scratch_blocks(W, B, max_piece) * B);
      for (int p = sp.base; p < pos; ++p) ASSERT_EQ(ring[slot(p)], p) << "copied to the scratch but overwritten";
      ASSERT_GE(sp.write_begin, pos);
      std::set<size_t> written;
      for (int p = sp.write_begin; p < pos + n; ++p) {
        ASSERT_TRUE(written.insert(slot(p)).second) << "two positions of the write-back share a slot";
        ring[slot(p)] = p;
      }
      pos += n;
      for (int p = std::max(0, pos - W); p < pos; ++p) ASSERT_EQ(ring[slot(p)], p) << "the window after the piece";
      if (rng.below(2)) {  // a few decode steps: one position each, written in place
        for (int d = 0; d < 3; ++d, ++pos) ring[slot(pos)] = pos;
      }
    }
  }
}

}  // namespace
}  // namespace megadecode::cuda::prefill
