// Planning policies: the ablation knobs of the decode plan; `default` is what the engine runs.
//
//   default   tiles sized to the SM count, dealt round-robin continuing where the previous wave
//             ended; attention items placed largest first on the least-loaded SM.
//   grid-sync every task of wave w waits on all of wave w-1 (what kernel boundaries impose).
//   long-splits  attention splits of at least 512 tokens (default: 256): half the items, each with
//             twice the K/V, so fewer items pay the item's fixed cost (the timing model predicts
//             batch 8 at 8K 20 % faster and batch 1 unchanged: docs/perf/journal/2026-12.md).
//             Like the default, a sequence's split depends on its own context only.
//   equal-up-shares  parallel blocks only: every SM's expert-up share the same size (default:
//             smaller on the SMs that run the layer's attention items, up_balance_tokens_per_unit).
//   router-after-attn  parallel blocks (cohere2_moe) only: the router tiles wait for the layer's
//             attention (waves QKV, ATTN, ROUTER, ...), so routing and the expert stream no longer
//             overlap attention: the ablation that shows the overlap's gain. Sequential blocks
//             (qwen3_moe): the same plan as default (their router waits on O-proj anyway).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megadecode {

struct Policy {
  std::string name = "default";
  bool grid_sync = false;
  bool router_after_attn = false;  // parallel blocks: the router waits for the layer's attention

  // GEMM tiles per op and SM: an op's 16-row blocks are cut into min(blocks, tiles_per_sm * SMs)
  // contiguous tiles of (almost) equal weight bytes. 1 is what decode wants (every SM streams its
  // share of each op once); tests raise it to put several tiles of one op on an SM.
  int tiles_per_sm = 1;

  // Attention splits, per sequence from its own context only (batch invariance): splits of at
  // least attn_min_split_tokens, at most attn_max_splits per sequence, lengths rounded up to
  // whole KV blocks.
  int attn_min_split_tokens = 256;
  int attn_max_splits = 64;

  // Parallel blocks (cohere2_moe): an SM's expert-up share streams its pages after its attention
  // items of the layer, the other SMs' as soon as the routing is known. The up shares are weighted
  // so that all of them end together (planner_assemble.cpp balance_up_shares): an SM's items
  // count as their key positions / up_balance_tokens_per_unit up units of work ahead of its share.
  // 0: equal shares.
  double up_balance_tokens_per_unit = 86.0;
};

Policy policy_by_name(const std::string& name);  // Error naming the known ones
std::vector<std::string> policy_names();

}  // namespace megadecode
