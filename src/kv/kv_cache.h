// Per-sequence block tables over a BlockPool: admission with prefix-cache matching, growing a
// table as a sequence decodes, registering blocks as they fill, freeing. The engine's scheduler
// calls this; the block table it returns is what the backend reads and writes KV through.
//
// Two pools when the model has sliding-window layers (docs/architecture.md, "KV cache"):
//  - the full pool: the full-attention layers' K/V, a block per block_size positions of a
//    sequence (its block table), with the prefix cache;
//  - the ring pool: the sliding layers' K/V, a ring of at most R = kv_ring_length(W, block_size)
//    blocks a sequence (its ring table), allocated lazily as positions grow and never more than R:
//    position p lives in ring block (p / block_size) % R, slot p % block_size. A position
//    overwritten by p + R * block_size is out of the window by then (R * B >= W + B).
// With a ring pool the prefix cache is off: a hit skips computing the prompt's cached tokens, and
// their sliding layers' K/V (the last W positions of the hit) is kept nowhere. A model without
// sliding layers has no ring pool, and everything is as with one pool.
// Threading: owned by the engine's scheduler thread; not thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace megadecode {

// The ring length R of a sequence's sliding-window layers: ceil(window / block_size) + 1 blocks,
// enough that the block position p writes never holds a key of p's window (the oldest of them,
// p - window + 1, is at most R - 1 blocks back). 0 when window is 0 (no sliding layers).
int kv_ring_length(int window, int block_size);

// What admitting a sequence would take.
struct KvAdmission {
  std::vector<int> cached_blocks;  // prefix-cache hits, in order; their tokens need no prefill
  std::vector<uint64_t> cached_hashes;
  int n_new_blocks = 0;            // blocks to allocate on top of the hits
  int n_blocks_needed = 0;         // blocks this takes out of n_available() (hits that sit on the LRU count)
  int n_ring_blocks = 0;           // ring-pool blocks to allocate (0 without a ring pool)
};

class KvCache {
 public:
  // `n_ring_blocks` and `ring_length` (R) are both 0 (no sliding layers) or both positive, with at
  // least one whole ring of blocks.
  KvCache(int n_blocks, int block_size, bool enable_prefix_cache, int n_ring_blocks = 0, int ring_length = 0);

  int block_size() const { return pool_.block_size(); }
  int n_blocks() const { return pool_.n_blocks(); }
  int n_available() const { return pool_.n_available(); }
  int n_used() const { return pool_.n_used(); }
  const BlockPool& pool() const { return pool_; }
  int blocks_for(int n_positions) const { return (n_positions + block_size() - 1) / block_size(); }
  bool prefix_cache_enabled() const { return pool_.prefix_cache_enabled(); }

  // The ring pool (all 0 without one).
  int ring_length() const { return ring_length_; }
  int n_ring_blocks() const { return ring_ ? ring_->n_blocks() : 0; }
  int n_ring_available() const { return ring_ ? ring_->n_available() : 0; }
  int n_ring_used() const { return ring_ ? ring_->n_used() : 0; }
  // Ring blocks a sequence with positions [0, n_positions) holds: min(blocks_for(n), R).
  int ring_blocks_for(int n_positions) const { return std::min(blocks_for(n_positions), ring_length_); }

  // Plans the admission of `tokens` with positions [0, n_positions) allocated; full blocks of
  // tokens[0, max_cached_tokens) may come from the prefix cache.
  KvAdmission plan_admission(std::span<const int32_t> tokens, int max_cached_tokens, int n_positions) const;
  bool fits(const KvAdmission& plan) const {
    return plan.n_blocks_needed <= n_available() && plan.n_ring_blocks <= n_ring_available();
  }
  // Applies a plan that fits(); returns the number of tokens served from the cache.
  int admit(int64_t seq, const KvAdmission& plan);
  // Grows seq's table (and ring, up to R) to cover positions [0, n_positions); false (and nothing
  // changed) when either pool has too few blocks.
  bool ensure(int64_t seq, int n_positions);
  // tokens[0, n_computed) now have their KV written: registers every newly full block.
  void commit(int64_t seq, std::span<const int32_t> tokens, int n_computed);
  // Releases every block of seq, of both pools (full blocks stay in the prefix cache until evicted).
  void free(int64_t seq);

  bool has(int64_t seq) const { return seqs_.count(seq) != 0; }
  std::span<const int32_t> table(int64_t seq) const;
  std::span<const int32_t> ring_table(int64_t seq) const;  // empty without a ring pool
  size_t n_seqs() const { return seqs_.size(); }

  // Pool invariants, plus: each block's refcount equals the number of tables holding it, no table
  // holds a block twice, and a ring table holds ring_blocks_for(its block table's positions).
  void check_invariants() const;

 private:
  struct SeqBlocks {
    std::vector<int32_t> table;  // logical block i -> physical block
    std::vector<int32_t> ring;   // ring block i -> physical block of the ring pool
    int n_committed = 0;         // leading full blocks registered in the prefix cache
    uint64_t last_hash = kRootHash;
  };
  BlockPool pool_;
  std::optional<BlockPool> ring_;  // present when ring_length_ > 0
  int ring_length_ = 0;
  std::unordered_map<int64_t, SeqBlocks> seqs_;
};

}  // namespace megadecode
