// How many blocks the KV pools of a GPU backend get (docs/architecture.md, "KV cache").
//
// A model's layers split between two pools (kv/kv_cache.h): the full pool holds the
// full-attention layers' K/V, a block per block_size positions of a sequence; the ring pool holds
// the sliding-window layers' K/V, at most R = kv_ring_length(W, B) blocks a sequence. A block of
// either pool holds only its own layers, so a sliding layer costs a sequence at most R blocks of
// memory whatever its length.
//
// Sizing from a byte budget: the ring pool needs no more than max_seqs * R blocks (no sequence
// holds more than R, and at most max_seqs are resident), nor more than the full pool (a sequence
// holds min(its full blocks, R) ring blocks). So it gets min(n_blocks, max_seqs * R), but at least
// one whole ring (R: the KV cache takes no less, kv/kv_cache.h), and the full pool gets the rest
// of the budget: with that rule the ring pool never refuses a sequence the full pool takes, and no
// budget is left over that would buy one more full block.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace megadecode {

// Bytes of one block of each pool.
struct KvPoolShape {
  int n_full_layers = 0;        // layers in the full pool: every layer but the sliding ones
  int n_ring_layers = 0;        // sliding-window layers (0: no ring pool)
  int ring_length = 0;          // R: ring blocks a sequence holds at most (0 without sliding layers)
  int64_t full_block_bytes = 0; // one full-pool block: K and V of block_size positions, every full layer
  int64_t ring_block_bytes = 0; // one ring-pool block: the same for every sliding layer (0 without)
};

// The pools of `config` with blocks of `block_size` positions and `elem_bytes` per K/V element.
KvPoolShape kv_pool_shape(const ModelConfig& config, int block_size, int elem_bytes);

struct KvPoolSizes {
  int64_t n_blocks = 0;       // full pool
  int64_t n_ring_blocks = 0;  // ring pool (0 without sliding layers)
  int64_t bytes(const KvPoolShape& s) const { return n_blocks * s.full_block_bytes + n_ring_blocks * s.ring_block_bytes; }
};

// The pool sizes for at most `max_seqs` resident sequences. `n_blocks` and `n_ring_blocks` given
// (> 0) are taken as they are; a pool given as 0 is sized: the ring pool by the rule above, the
// full pool from `budget_bytes` (both pools' bytes) when n_blocks is 0. The full pool is capped at
// 2^30 blocks. Errors on a negative count or budget, or max_seqs < 1. Whether the result is large
// enough (a block per sequence, a whole ring) is the caller's to check.
KvPoolSizes size_kv_pools(const KvPoolShape& shape, double budget_bytes, int max_seqs, int64_t n_blocks = 0,
                          int64_t n_ring_blocks = 0);

}  // namespace megadecode
