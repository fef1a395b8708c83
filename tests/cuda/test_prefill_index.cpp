// CPU tests of the GPU prefill path's index math (src/cuda/prefill/prefill_index.h): the fused
// row orders DeviceWeights builds, the paged KV address, the attention tile rows and the cutting of
// a chunk into pieces.
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

// Key splits: 1 when the query tiles fill the target alone; otherwise CTAs within the target (the
// partial buffers are sized by it), each split at least kAttnMinSplitTiles key tiles of the longest
// query tile, and the splits of every query tile cover its key tiles once, in order.
TEST(PrefillIndex, KeySplitsStayWithinTheTargetAndCoverEveryKeyTileOnce) {
  constexpr int kTarget = 264;
  EXPECT_EQ(attn_key_splits(0, 2048, 8, 4, kTarget), 1) << "128 tiles x 4 groups fill it";
  EXPECT_EQ(attn_key_splits(10000, 16, 8, 4, kTarget), kAttnMaxKeySplits) << "one tile a group, 10K keys";
  EXPECT_EQ(attn_key_splits(0, 16, 8, 4, kTarget), 1) << "16 keys: nothing to split";
  EXPECT_EQ(attn_key_splits(200, 100, 8, 4, kTarget), 1) << "5 key tiles: under two splits' minimum";
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
