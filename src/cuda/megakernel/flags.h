// The megakernel's benchmark switches (MkParams::flags; 0 in production) and their names, plain
// C++ for the host tools (bench decode --switches and its ablations).
#pragma once

#include <cstdint>

namespace megadecode::cuda {

// Benchmark switches (MkParams::flags; 0 in production). Ablations of `bench decode --ablations`.
enum MkFlag : uint32_t {
  kMkLoaderInOrder = 1u << 0,  // the loader issues a task's weight pages only once the consumers
                               // started it (no streaming ahead of the dependencies)
  kMkL2Prefetch = 1u << 1,     // L2 prefetch of the next tasks' weights during the routing gap (off by
                               // default: on the H200 it made batch 1 at 8K 10 % slower, 7.13 vs 6.39 ms)
  kMkPollBackoff = 1u << 2,    // counter polls back off 32 -> 256 ns (the first kernel's) instead of spinning
  kMkKvPrefetch = 1u << 3,     // the loader prefetches each attention item's K and V rows into L2 as it
                               // passes the item (ahead of the item's QKV wait)
  // Bits 4-6: the loader's cap on pages issued and not landed: 0 the default (kMkDefaultInflight),
  // 2 or 3 that cap, 4 none (as many as the ring has free slots). Every SM's bulk copies in flight
  // queue ahead of its small loads (counter polls, fills, the router logits, attention merges).
  kMkInflight2 = 2u << 4,
  kMkInflight3 = 3u << 4,
  kMkInflightOff = 4u << 4,
  kMkSampleFullPass = 1u << 7,  // SAMPLE reads the whole logits row for its argmax, not the LM head
                                // tiles' LogitBest entries (the pass the tiles took over: same tokens)
  kMkDownSplitK = 1u << 8,      // batch <= 8: each expert-down job split over the 8 consumer warps with a
                                // reduction and a barrier a job, not one warp a job (ops.cuh
                                // down_jobs_by_warp; the same bits)
  kMkExpertsUncapped = 1u << 9,  // the experts' pages (up and down shares) issued as soon as a slot is
                                 // free, not under the inflight cap (the other tasks' pages keep it)
  kMkDownUncapped = 1u << 10,    // the same for the expert-down shares' pages only
  kMkExpertsUncappedLate = 1u << 11,  // the experts' pages uncapped once the consumers are on their task
                                      // (before that, while they run attention or wait, under the cap)
  kMkDownWaitsFirst = 1u << 12,  // a down share meets every wait at its start, kLastWaitAtWrite or not
};
inline constexpr uint32_t kMkInflightMask = 7u << 4;
// The default: one page in flight per SM (H100, 8K, no cap -> 1: North b1 3.980 -> 3.877 ms,
// b8 16.637 -> 15.355; qwen3 b1 4.454 -> 4.371; caps 2 and 3 between; bench/results/abl-*-h100-*.json).
inline constexpr uint32_t kMkDefaultInflight = 1;
// The cap of `flags` (0: none).
inline constexpr uint32_t mk_inflight_cap(uint32_t flags) {
  const uint32_t v = (flags & kMkInflightMask) >> 4;
  return v == 0 ? kMkDefaultInflight : v >= 4 ? 0u : v;
}
// `flags` with switch `sw` on: an inflight cap replaces the one in `flags`, other bits add.
inline constexpr uint32_t mk_with_switch(uint32_t flags, uint32_t sw) {
  return (sw & kMkInflightMask) != 0 ? (flags & ~kMkInflightMask) | sw : flags | sw;
}
// Their names (bench decode --switches, and its ablations in this order).
struct MkSwitch {
  const char* name;
  uint32_t flag;
};
inline constexpr MkSwitch kMkSwitches[] = {
    {"loader-in-order", kMkLoaderInOrder}, {"l2-prefetch", kMkL2Prefetch}, {"poll-backoff", kMkPollBackoff},
    {"kv-prefetch", kMkKvPrefetch},        {"inflight-2", kMkInflight2},   {"inflight-3", kMkInflight3},
    {"inflight-off", kMkInflightOff},      {"sample-full-pass", kMkSampleFullPass},
    {"down-split-k", kMkDownSplitK},       {"experts-uncapped", kMkExpertsUncapped},
    {"down-uncapped", kMkDownUncapped},    {"experts-uncapped-late", kMkExpertsUncappedLate},
    {"down-waits-first", kMkDownWaitsFirst},
};

}  // namespace megadecode::cuda
