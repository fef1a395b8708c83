// The paged KV cache's bookkeeping (DESIGN §6): which physical KV blocks are free, which are held
// and by how many sequences (reference counts), and which hold a full block of a known token
// prefix (the prefix cache). The KV data itself lives in the backend; this only hands out ids.
//
// Every block is in exactly one state:
//   free    refcount 0, no prefix hash            (on the free list)
//   cached  refcount 0, registered prefix hash    (on the LRU list, evicted oldest first)
//   used    refcount > 0, with or without a hash  (held by one or more sequences)
// Threading: owned by the engine's scheduler thread; not thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace megadecode {

// The chain hash of one full block: depends on the hash of the block before it (kRootHash for
// the first block) and on the block's token ids, so equal hashes mean equal prefixes.
constexpr uint64_t kRootHash = 0x6d65676164656364ull;
uint64_t block_chain_hash(uint64_t parent_hash, std::span<const int32_t> tokens);

class BlockPool {
 public:
  BlockPool(int n_blocks, int block_size, bool enable_prefix_cache);

  int n_blocks() const { return static_cast<int>(blocks_.size()); }
  int block_size() const { return block_size_; }
  bool prefix_cache_enabled() const { return prefix_cache_; }
  // Blocks allocate() can hand out now: free ones plus unreferenced cached ones (evictable).
  int n_available() const { return static_cast<int>(free_.size() + lru_.size()); }
  int n_used() const { return n_used_; }
  int n_cached_unreferenced() const { return static_cast<int>(lru_.size()); }
  int refcount(int block) const { return blocks_.at(block).refcount; }

  // A block with refcount 1 and no hash; evicts the least recently released cached block when no
  // free block is left. -1 when every block is in use.
  int allocate();
  // One more holder of `block` (a cached block found by lookup(), or a shared block).
  void acquire(int block);
  // One holder fewer; at refcount 0 the block becomes cached (when it has a hash) or free.
  void release(int block);

  // The cached block holding exactly `tokens` after the prefix whose chain hash is `parent_hash`;
  // -1 when none. `hash` is block_chain_hash(parent_hash, tokens).
  int lookup(uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens) const;
  // `block` (held) now holds the KV of `tokens` (a full block) after the prefix `parent_hash`.
  // Ignored when the prefix cache is off or another block already caches this prefix.
  void register_full(int block, uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens);

  // Aborts (MD_CHECK) when the states above are inconsistent.
  void check_invariants() const;

 private:
  struct Block {
    int refcount = 0;
    bool hashed = false;
    bool on_free_list = false;
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    std::vector<int32_t> tokens;      // [block_size] the prefix block's token ids, when hashed
    std::list<int>::iterator lru_pos;  // valid when hashed and refcount == 0
  };
  void unhash(int block);

  int block_size_;
  bool prefix_cache_;
  int n_used_ = 0;
  std::vector<Block> blocks_;
  std::vector<int> free_;  // stack of free block ids
  std::list<int> lru_;     // cached, unreferenced blocks; front = released longest ago
  std::unordered_map<uint64_t, int> by_hash_;
};

}  // namespace megadecode
