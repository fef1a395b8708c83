// A mixed step's prompt attention as a work list (cuda/batched replays mixed steps from graphs, so
// the pieces' positions, sizes and tables cannot be launch arguments): the host cuts each piece
// into items of (query tile, key split), uploads them with the step's inputs, and the attention
// kernel's CTAs take items c, c + grid, ... (prefill_kernels.h AttnArgs work mode). Split items
// write partials into slots `part * n_kv_heads + g`; each split row's merge descriptor names its
// tile's first slot. Plain C++; the CPU tests (tests/cuda/prefill/test_prefill_index.cpp) check the
// cover and the slot bounds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "core/check.h"
#include "cuda/prefill/prefill_index.h"

namespace megadecode::cuda::prefill {

// One item: query tile q_tile of a piece, key split `split` of `splits` (the piece's
// attn_key_splits); with splits > 1 its partial goes to slot part * G + g.
struct AttnWork {
  int32_t row0;       // the piece's first row of q and out
  int32_t start_pos;  // the piece's first position
  int32_t n_tokens;   // the piece's tokens
  int32_t table;      // the piece's block table: entries past AttnArgs::block_table
  int32_t q_tile, split, splits, part;
};
// A prompt row's merge: splits <= 1 means its tile wrote the row itself.
struct AttnMergeRow {
  int32_t part0;       // the slot index of its tile's split 0 (splits 1.. follow)
  int32_t splits;
  int32_t tile_token;  // the row's token within its query tile
};
struct AttnPieceDesc {
  int row0, n_tokens, start_pos, table;
};

// Items a step of prompt_rows prompt tokens may need, however they are cut into pieces: a piece
// that does not split has ceil(n / tile) tiles (at most n / tile + 1); one that splits has
// q_tiles x G x splits <= its share of target_ctas (attn_key_splits), the shares summing to
// at most target_ctas.
constexpr int attn_work_capacity(int prompt_rows, int group_size, int n_kv_heads, int target_ctas) {
  return ceil_div(prompt_rows, attn_tile_tokens(group_size)) + prompt_rows + target_ctas / n_kv_heads + 1;
}

// Fills work (items, longest key range first, ties in piece order) and merge (one entry per row
// from merge_row0 on; rows outside every piece get splits 0); returns the number of items. Each
// piece splits its keys for target_ctas / pieces CTAs, so the split items' slots stay below
// target_ctas.
inline int attn_work_list(std::span<const AttnPieceDesc> pieces, int group_size, int n_kv_heads, int target_ctas,
                          int merge_row0, std::span<AttnWork> work, std::span<AttnMergeRow> merge) {
  MD_REQUIRE(group_size >= 1 && n_kv_heads >= 1 && target_ctas >= 1, "attention work list: bad sizes");
  std::fill(merge.begin(), merge.end(), AttnMergeRow{0, 0, 0});
  if (pieces.empty()) return 0;
  const int share = std::max(1, target_ctas / static_cast<int>(pieces.size()));
  const int tq = attn_tile_tokens(group_size);
  int n = 0, part = 0;
  for (const AttnPieceDesc& p : pieces) {
    MD_REQUIRE(p.n_tokens >= 1 && p.start_pos >= 0 && p.row0 >= merge_row0 &&
                   p.row0 + p.n_tokens - merge_row0 <= static_cast<int>(merge.size()),
               "attention work list: piece rows [", p.row0, ", ", p.row0 + p.n_tokens, ") outside the ",
               merge.size(), " prompt rows from ", merge_row0);
    const int splits = attn_key_splits(p.start_pos, p.n_tokens, group_size, n_kv_heads, share);
    for (int qt = 0; qt < attn_q_tiles(p.n_tokens, group_size); ++qt) {
      const int part0 = splits > 1 ? part : 0;
      for (int s = 0; s < splits; ++s) {
        MD_REQUIRE(n < static_cast<int>(work.size()), "attention work list: over its ", work.size(), " items");
        work[n++] = AttnWork{p.row0, p.start_pos, p.n_tokens, p.table, qt, s, splits, splits > 1 ? part++ : 0};
      }
      for (int t = qt * tq; t < std::min(p.n_tokens, (qt + 1) * tq); ++t)
        merge[p.row0 + t - merge_row0] = AttnMergeRow{part0, splits, t - qt * tq};
    }
  }
  MD_CHECK(part * n_kv_heads <= target_ctas, "attention work list: ", part, " split items over the partial slots");
  auto key_tiles = [&](const AttnWork& w) {
    const int n_kt = ceil_div(attn_key_end(w.start_pos, w.n_tokens, w.q_tile, group_size), kAttnKeyTile);
    const AttnTileRange r = attn_split_tiles(n_kt, w.split, w.splits);
    return r.end - r.begin;
  };
  std::stable_sort(work.begin(), work.begin() + n,
                   [&](const AttnWork& a, const AttnWork& b) { return key_tiles(a) > key_tiles(b); });
  return n;
}

}  // namespace megadecode::cuda::prefill
