// CPU tests of the GPU prefill path's index math (src/cuda/prefill/prefill_index.h): the fused
// row orders DeviceWeights builds, the paged KV address, the attention tile rows, the MoE tile list
// of the grouped expert GEMMs (against a plain recount) and the cutting of a chunk into pieces.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <set>
#include <tuple>
#include <vector>

#include "core/rng.h"
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

// Routes random tokens (uniform, skewed, all to one expert), builds the tile list and checks it
// against a plain recount: offsets are the exclusive prefix, tiles cover each expert's slots in
// order with at most kGemmTileTokens each, and the count stays within moe_tile_capacity.
TEST(PrefillIndex, MoeTileListCoversEverySlotOnce) {
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
    const int cap = moe_tile_capacity(T * K, E);
    std::vector<int32_t> offsets(E + 1, -7);
    std::vector<MoeTile> tiles(cap);
    const int n_tiles = build_moe_tiles(counts.data(), E, offsets.data(), tiles.data(), cap);
    ASSERT_GE(n_tiles, 0) << "trial " << trial << ": over capacity " << cap;
    int off = 0, ti = 0;
    for (int e = 0; e < E; ++e) {
      ASSERT_EQ(offsets[e], off);
      for (int s = 0; s < counts[e]; s += kGemmTileTokens, ++ti) {
        ASSERT_LT(ti, n_tiles);
        EXPECT_EQ(tiles[ti].expert, e);
        EXPECT_EQ(tiles[ti].slot0, off + s);
        EXPECT_EQ(tiles[ti].n, std::min(kGemmTileTokens, counts[e] - s));
      }
      off += counts[e];
    }
    EXPECT_EQ(offsets[E], T * K);
    EXPECT_EQ(ti, n_tiles);
    if (n_tiles > 0) {  // one fewer slot of capacity than needed is reported, never overrun
      std::vector<MoeTile> small(n_tiles - 1);
      const std::vector<int32_t> full = offsets;
      std::fill(offsets.begin(), offsets.end(), -7);
      EXPECT_EQ(build_moe_tiles(counts.data(), E, offsets.data(), small.data(), n_tiles - 1), -1);
      // The scatter kernel indexes slots with these offsets even then: all of them are written.
      EXPECT_EQ(offsets, full) << "trial " << trial << ": offsets left unwritten after the overflow";
    }
  }
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

TEST(PrefillIndex, GemmTileCounts) {
  EXPECT_EQ(gemm_row_tiles(5120), 40);
  EXPECT_EQ(gemm_row_tiles(1), 1);
  EXPECT_EQ(gemm_row_tiles(129), 2);
  EXPECT_EQ(gemm_token_tiles(2048), 16);
  EXPECT_EQ(gemm_token_tiles(2049), 17);
  EXPECT_EQ(gemm_k_stages(768), 12);
  EXPECT_EQ(gemm_k_stages(16), 1);
  EXPECT_EQ(gemm_k_stages(80), 2);
  // The SwiGLU epilogue writes 64 columns per 128-row tile: a fused matrix of 2I rows -> I columns.
  EXPECT_EQ(gemm_row_tiles(2 * 768) * kGemmTileRows / 2, 768);
}

}  // namespace
}  // namespace megadecode::cuda::prefill
