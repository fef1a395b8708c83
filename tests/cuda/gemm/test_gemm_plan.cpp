// CPU tests of the many-row GEMM engine's index math (src/cuda/gemm/gemm_plan.h), which the kernel
// and the host share: tile configurations fit shared memory, the work-tile numbering covers every
// (row tile, split, column) once, the K splits partition K on split units independently of the
// tokens, and the per-expert tile list covers every slot once (against a plain recount).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "cuda/gemm/gemm_plan.h"

namespace megadecode::cuda::gemm {
namespace {

constexpr int kH200SmemOptin = 232448;  // the H200's opt-in shared memory per block

TEST(GemmPlan, EveryTileConfigurationFitsTwoStagesAndItsWarps) {
  for (int nt : {1, 2, 4, 8, 16}) {
    ASSERT_TRUE(valid_token_groups(nt));
    EXPECT_EQ(kConsumerWarps, kTileRowBlocks) << "one row block per consumer warp";
    EXPECT_EQ(kConsumerWarps % 4, 0) << "whole warpgroups";
    EXPECT_EQ(kSplitUnitKb % stage_kb(nt), 0) << "a split unit is whole stages, nt " << nt;
    EXPECT_EQ(stage_weight_bytes(nt) % 128, 0) << "the activation area starts 128-byte aligned";
    EXPECT_EQ(stage_bytes(nt) % 128, 0);
    EXPECT_GE(stage_bytes(nt), stage_weight_bytes(nt) + stage_kb(nt) * 8 * nt * 32) << "every token's k of the stage";
    EXPECT_GE((kH200SmemOptin - 256) / stage_bytes(nt), 3) << "at least three stages in flight, nt " << nt;
  }
  for (int nt : {0, 3, 5, 32}) EXPECT_FALSE(valid_token_groups(nt));
}

// Activation rows arrive as TMA boxes of 64 k x the tile's tokens with a 128-byte swizzle: each box
// must start on a 1024-byte atom (the stage ring starts on one; the weights before the boxes, each
// box and each stage are whole atoms), a stage is its weights and its boxes, and a stage's k is
// whole boxes; the slack for aligning the ring still leaves three stages.
TEST(GemmPlan, TmaBoxesFillTheActivationAreaOnSwizzleAtoms) {
  for (int nt : {1, 2, 4, 8, 16}) {
    SCOPED_TRACE(nt);
    EXPECT_EQ(stage_kb(nt) * 16 % kXBoxK, 0) << "a stage is whole boxes";
    EXPECT_EQ(stage_bytes(nt), stage_weight_bytes(nt) + stage_x_boxes(nt) * stage_x_box_bytes(nt));
    EXPECT_EQ(stage_x_box_bytes(nt), 8 * nt * kXBoxK * 2) << "one 128-byte row per token";
    EXPECT_EQ(stage_weight_bytes(nt) % kStageAlign, 0);
    EXPECT_EQ(stage_x_box_bytes(nt) % kStageAlign, 0);
    EXPECT_EQ(stage_bytes(nt) % kStageAlign, 0);
    EXPECT_GE((kH200SmemOptin - 256 - kStageAlign) / stage_bytes(nt), 3) << "three stages after the alignment slack";
  }
}

TEST(GemmPlan, DenseTokenGroupsHoldTheTokensUpTo128) {
  for (int n = 1; n <= 4096; ++n) {
    const int nt = dense_token_groups(n);
    ASSERT_TRUE(valid_token_groups(nt));
    if (n <= 128) {
      EXPECT_GE(8 * nt, n);
      if (nt > 1) {
        EXPECT_LT(4 * nt, n) << "the smallest tile that holds " << n;
      }
    } else {
      EXPECT_EQ(nt, 16);
    }
  }
  // Grouped: about twice the mean rows per expert (decode batch 64: 4 rows -> 8-token tiles; 256: 16 -> 32).
  EXPECT_EQ(grouped_token_groups(64 * 8, 128), 1);
  EXPECT_EQ(grouped_token_groups(128 * 8, 128), 2);
  EXPECT_EQ(grouped_token_groups(256 * 8, 128), 4);
  EXPECT_EQ(grouped_token_groups(2048 * 8, 128), 16);
  EXPECT_EQ(grouped_token_groups(1, 128), 1);
}

// The splits of K are whole 128-k units, in order, non-empty, covering [0, n_kb) exactly, and the
// split count depends on the weight shape alone.
TEST(GemmPlan, KSplitsPartitionKOnUnits) {
  for (int k : {16, 128, 144, 768, 2048, 4096, 4112})
    for (int splits = 1; splits <= std::min(kMaxSplits, k_units(k)); ++splits) {
      int next = 0;
      for (int s = 0; s < splits; ++s) {
        const KbRange r = split_kb_range(s, splits, k);
        EXPECT_EQ(r.begin, next) << "k " << k << " splits " << splits << " s " << s;
        EXPECT_GT(r.end, r.begin);
        EXPECT_EQ(r.begin % kSplitUnitKb, 0);
        next = r.end;
      }
      EXPECT_EQ(next, (k + 15) / 16) << "k " << k << " splits " << splits;
    }
  // The full shape on 132 SMs: QKV 40 row tiles x 3 (one wave of 120), O-proj 16 x 8 (one wave of
  // 128), router 1 x 8, LM head 1187 x 1 (nine waves already).
  EXPECT_EQ(dense_k_splits(5120, 2048, 132), 3);
  EXPECT_EQ(dense_k_splits(2048, 4096, 132), 8);
  EXPECT_EQ(dense_k_splits(128, 2048, 132), 8);
  EXPECT_EQ(dense_k_splits(151936, 2048, 132), 1);
  for (int rows : {16, 128, 1000, 5120, 20000})
    for (int k : {16, 128, 256, 768, 2048, 4096}) {
      const int s = dense_k_splits(rows, k, 132);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, std::max(1, k_units(k) / 2)) << "a split keeps at least two units";
      // No other count gives the busiest SM fewer bytes.
      const int tiles = (rows + kTileRows - 1) / kTileRows;
      auto load = [&](int x) { return static_cast<double>((tiles * x + 131) / 132) / x; };
      for (int x = 1; x <= std::max(1, k_units(k) / 2); ++x) EXPECT_LE(load(s), load(x) + 1e-12) << rows << " " << k;
    }
}

// A dense GEMM that would leave most SMs idle takes smaller token tiles (the router), never below one group.
TEST(GemmPlan, UnderfilledDenseGemmsTakeSmallerTokenTiles) {
  EXPECT_EQ(dense_tile_groups(128, 64, 8, 132), 1);    // router at 64 rows: 64 tiles, not 8
  EXPECT_EQ(dense_tile_groups(128, 256, 8, 132), 2);   // 16 columns x 8 splits = 128 tiles
  EXPECT_EQ(dense_tile_groups(5120, 64, 3, 132), 8);   // QKV: 120 tiles, one wave already
  EXPECT_EQ(dense_tile_groups(151936, 256, 1, 132), 16);
  for (int rows : {16, 128, 2048, 5120})
    for (int n : {1, 7, 64, 200, 256})
      for (int splits : {1, 3, 8}) {
        const int tg = dense_tile_groups(rows, n, splits, 132);
        EXPECT_TRUE(valid_token_groups(tg));
        EXPECT_LE(tg, dense_token_groups(n));
        if (tg > 1) {
          EXPECT_GE(2 * dense_tiles(rows, n, tg, splits), 132) << rows << " " << n << " " << splits;
        }
      }
}

// Every (row tile, split, column) is one tile number, and back, for every band width (a last band
// narrower than the others included); within a band, consecutive tiles share their weight rows, and
// a band's columns are consecutive and finish before the next band starts.
TEST(GemmPlan, TileNumberingIsABijection) {
  for (int row_tiles : {1, 3, 40})
    for (int splits : {1, 4, 9})
      for (int columns : {1, 2, 5, 7})
        for (int band : {1, 2, 3, 7, 100}) {
          std::set<std::tuple<int, int, int>> seen;
          const int total = row_tiles * splits * columns;
          int band_first = 0, band_end = 0;  // the current band's columns
          for (int t = 0; t < total; ++t) {
            const TileCoord c = tile_coord(t, row_tiles, columns, splits, band);
            ASSERT_GE(c.row_tile, 0);
            ASSERT_LT(c.row_tile, row_tiles);
            ASSERT_GE(c.split, 0);
            ASSERT_LT(c.split, splits);
            ASSERT_GE(c.column, 0);
            ASSERT_LT(c.column, columns);
            if (c.column >= band_end) {  // a new band: it starts at its first column and row tile 0
              band_first = band_end;
              band_end = std::min(columns, band_first + band);
              EXPECT_EQ(c.column, band_first) << t;
              EXPECT_EQ(c.row_tile, 0) << t;
              EXPECT_EQ(c.split, 0) << t;
            }
            EXPECT_GE(c.column, band_first) << t;
            const int width = band_end - band_first;
            EXPECT_EQ(band_first * row_tiles * splits + (c.row_tile * splits + c.split) * width + c.column - band_first, t);
            if (t > 0 && c.column > band_first) {
              EXPECT_EQ(tile_coord(t - 1, row_tiles, columns, splits, band).row_tile, c.row_tile);
            }
            seen.insert({c.row_tile, c.split, c.column});
          }
          EXPECT_EQ(static_cast<int>(seen.size()), total);
        }
  // Grouped GEMMs (bands of one column): a tile-list entry's row tiles run back to back.
  for (int t = 0; t < 12 * 5; ++t) {
    EXPECT_EQ(tile_coord(t, 12, 5, 1, 1).column, t / 12);
    EXPECT_EQ(tile_coord(t, 12, 5, 1, 1).row_tile, t % 12);
  }
}

// Dense bands hold at most kBandXBytes of activation rows, at least one column: the 2048-token
// prefill pieces' GEMMs keep one band (every column), the 8192-token ones split.
TEST(GemmPlan, DenseBandsBoundTheActivationRows) {
  for (int k : {16, 768, 2048, 4096, 1 << 20})
    for (int tokens : {8, 16, 32, 64, 128}) {
      const int band = dense_band(k, tokens);
      EXPECT_GE(band, 1);
      if (band > 1) {
        EXPECT_LE(int64_t{band} * tokens * k * 2, kBandXBytes);
      }
      if (int64_t{band + 1} * tokens * k * 2 <= kBandXBytes) {
        EXPECT_EQ(band, 1 << 20) << k << " " << tokens;
      }
    }
  EXPECT_GE(dense_band(2048, 128), 2048 / 128);  // QKV at 2048 tokens: one band
  EXPECT_GE(dense_band(4096, 128), 2048 / 128);  // O-proj
  EXPECT_LT(dense_band(4096, 128), 8192 / 128);  // O-proj at 8192 tokens: more than one
}

TEST(GemmPlan, DenseTileCounts) {
  EXPECT_EQ(dense_tiles(5120, 64, 8, 4), 40 * 4);
  EXPECT_EQ(dense_tiles(5120, 256, 16, 4), 40 * 4 * 2);
  EXPECT_EQ(dense_tiles(151936, 9, 2, 1), 1187);
}

// Routes random tokens (uniform, skewed, all to one expert), builds the tile list and checks it
// against a plain recount: offsets are the exclusive prefix, tiles cover each expert's slots in
// order with at most T each (every tile size the engine uses), and the count stays within
// moe_tile_capacity.
TEST(GemmPlan, MoeTileListCoversEverySlotOnce) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu (MEGADECODE_SEED reproduces)\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const int E = 1 + static_cast<int>(rng.below(256));
    const int K = 1 + static_cast<int>(rng.below(std::min(E, 8)));
    const int T = 1 + static_cast<int>(rng.below(trial % 3 == 0 ? 4096 : 300));
    const int mode = trial % 4;  // 0 uniform, 1 skewed, 2 hot set of K experts, 3 tiny counts
    std::vector<int32_t> counts(E, 0);
    for (int t = 0; t < T; ++t) {
      std::set<int> chosen;
      while (static_cast<int>(chosen.size()) < K) {
        int e = static_cast<int>(rng.below(E));
        if (mode == 1) e = static_cast<int>(rng.below(1 + rng.below(E)));
        if (mode == 2) e = static_cast<int>(chosen.size());
        if (mode == 3 && rng.unit() < 0.9f) e = E - 1 - static_cast<int>(chosen.size());
        chosen.insert(e);
      }
      for (int e : chosen) ++counts[e];
    }
    const int tt = 8 << (trial % 5);  // 8, 16, 32, 64, 128 tokens a tile
    const int cap = moe_tile_capacity(T * K, E, tt);
    std::vector<int32_t> offsets(E + 1, -7);
    std::vector<MoeTile> tiles(cap);
    const int n_tiles = build_moe_tiles(counts.data(), E, tt, offsets.data(), tiles.data(), cap);
    ASSERT_GE(n_tiles, 0) << "trial " << trial << ": over capacity " << cap;
    int off = 0, ti = 0;
    for (int e = 0; e < E; ++e) {
      ASSERT_EQ(offsets[e], off);
      for (int s = 0; s < counts[e]; s += tt, ++ti) {
        ASSERT_LT(ti, n_tiles);
        EXPECT_EQ(tiles[ti].expert, e);
        EXPECT_EQ(tiles[ti].slot0, off + s);
        EXPECT_EQ(tiles[ti].n, std::min(tt, counts[e] - s));
      }
      off += counts[e];
    }
    EXPECT_EQ(offsets[E], T * K);
    EXPECT_EQ(ti, n_tiles);
    if (n_tiles > 0) {  // one fewer slot of capacity than needed is reported, never overrun
      std::vector<MoeTile> small(n_tiles - 1);
      const std::vector<int32_t> full = offsets;
      std::fill(offsets.begin(), offsets.end(), -7);
      EXPECT_EQ(build_moe_tiles(counts.data(), E, tt, offsets.data(), small.data(), n_tiles - 1), -1);
      // The scatter kernel indexes slots with these offsets even then: all of them are written.
      EXPECT_EQ(offsets, full) << "trial " << trial << ": offsets left unwritten after the overflow";
    }
  }
}

}  // namespace
}  // namespace megadecode::cuda::gemm
