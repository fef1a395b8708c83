// Per-sequence block tables over a BlockPool: admission with prefix-cache matching, growing a
// table as a sequence decodes, registering blocks as they fill, freeing. The engine's scheduler
// calls this; the block table it returns is what the backend reads and writes KV through.
// Threading: owned by the engine's scheduler thread; not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace megadecode {

// What admitting a sequence would take.
struct KvAdmission {
  std::vector<int> cached_blocks;  // prefix-cache hits, in order; their tokens need no prefill
  std::vector<uint64_t> cached_hashes;
  int n_new_blocks = 0;            // blocks to allocate on top of the hits
  int n_blocks_needed = 0;         // blocks this takes out of n_available() (hits that sit on the LRU count)
};

class KvCache {
 public:
  KvCache(int n_blocks, int block_size, bool enable_prefix_cache);

  int block_size() const { return pool_.block_size(); }
  int n_blocks() const { return pool_.n_blocks(); }
  int n_available() const { return pool_.n_available(); }
  int n_used() const { return pool_.n_used(); }
  const BlockPool& pool() const { return pool_; }
  int blocks_for(int n_positions) const { return (n_positions + block_size() - 1) / block_size(); }

  // Plans the admission of `tokens` with positions [0, n_positions) allocated; full blocks of
  // tokens[0, max_cached_tokens) may come from the prefix cache.
  KvAdmission plan_admission(std::span<const int32_t> tokens, int max_cached_tokens, int n_positions) const;
  bool fits(const KvAdmission& plan) const { return plan.n_blocks_needed <= n_available(); }
  // Applies a plan that fits(); returns the number of tokens served from the cache.
  int admit(int64_t seq, const KvAdmission& plan);
  // Grows seq's table to cover positions [0, n_positions); false (and nothing changed) when the
  // pool has too few blocks.
  bool ensure(int64_t seq, int n_positions);
  // tokens[0, n_computed) now have their KV written: registers every newly full block.
  void commit(int64_t seq, std::span<const int32_t> tokens, int n_computed);
  // Releases every block of seq (full blocks stay in the prefix cache until evicted).
  void free(int64_t seq);

  bool has(int64_t seq) const { return seqs_.count(seq) != 0; }
  std::span<const int32_t> table(int64_t seq) const;
  size_t n_seqs() const { return seqs_.size(); }

  // Pool invariants, plus: each block's refcount equals the number of tables holding it, and no
  // table holds a block twice.
  void check_invariants() const;

 private:
  struct SeqBlocks {
    std::vector<int32_t> table;  // logical block i -> physical block
    int n_committed = 0;         // leading full blocks registered in the prefix cache
    uint64_t last_hash = kRootHash;
  };
  BlockPool pool_;
  std::unordered_map<int64_t, SeqBlocks> seqs_;
};

}  // namespace megadecode
