// Planning policies: how waves are dealt to SMs, how tiles are ordered inside a wave, whether
// operations are separated by full barriers, and the tile sizes. These are the ablation knobs of
// the decode benchmark; `default` is what the engine runs.
//
//   default   waves dealt round-robin continuing where the previous wave ended (single-task waves
//             such as DISPATCH rotate over the SMs instead of piling onto SM 0); tiles ordered so
//             what becomes ready first comes first (QKV, attention and O-proj group-major).
//   sm0       every wave dealt from SM 0 (task k of a wave on SM k mod S).
//   row-major tiles in plain row order (O-proj row-block-major, attention items sequence-major):
//             an SM may block on group 3 while group 0 is ready.
//   grid-sync every task of wave w waits on all of wave w-1 (what kernel boundaries impose).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megadecode {

enum class WaveDeal { kRotate, kFromZero };
enum class TileOrder { kReadyFirst, kRowMajor };

struct Policy {
  std::string name = "default";
  WaveDeal deal = WaveDeal::kRotate;
  TileOrder order = TileOrder::kReadyFirst;
  bool grid_sync = false;

  // Tile sizes: bf16 weight bytes one task streams (decode is memory-bound: ~34 KB/us per SM on
  // an H200, so 128 KiB is ~4 us of streaming against ~1 us of per-task overhead, and at batch 1
  // the 8 active experts' 75 MB split into enough items to feed 132 SMs).
  int64_t tile_weight_bytes = 128 << 10;     // QKV, O-proj, router, expert items
  int64_t lm_tile_weight_bytes = 512 << 10;  // LM head tiles (many of them; fewer, larger)
  int row_align = 16;                        // rows per tile a multiple of this (MMA M = 16)
  int norm_tokens = 1;                       // tokens per norm / sample task

  // Attention splits, per sequence from its own context only (batch invariance): splits of at
  // least attn_min_split_tokens, at most attn_max_splits per sequence, lengths rounded up to
  // whole KV blocks.
  int attn_min_split_tokens = 256;
  int attn_max_splits = 64;
};

Policy policy_by_name(const std::string& name);  // Error naming the known ones
std::vector<std::string> policy_names();

}  // namespace megadecode
