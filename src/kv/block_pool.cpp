// BlockPool: free list + LRU of cached blocks + hash index; see block_pool.h for the states.
#include "kv/block_pool.h"

#include <algorithm>

#include "core/check.h"
#include "core/rng.h"

namespace megadecode {

uint64_t block_chain_hash(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent_hash ^ 0x9ddfea08eb382d69ull);
  for (int32_t t : tokens) h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) * 0xff51afd7ed558ccdull));
  return mix64(h + tokens.size());
}

BlockPool::BlockPool(int n_blocks, int block_size, bool enable_prefix_cache)
    : block_size_(block_size), prefix_cache_(enable_prefix_cache) {
  MD_REQUIRE(n_blocks > 0, "KV block pool: need at least one block, got ", n_blocks);
  MD_REQUIRE(block_size > 0, "KV block pool: block size must be positive, got ", block_size);
  blocks_.resize(n_blocks);
  free_.reserve(n_blocks);
  // Hand out low ids first (stack): push in reverse.
  for (int b = n_blocks - 1; b >= 0; --b) {
    free_.push_back(b);
    blocks_[b].on_free_list = true;
  }
}

int BlockPool::allocate() {
  int b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
    blocks_[b].on_free_list = false;
  } else if (!lru_.empty()) {
    b = lru_.front();
    lru_.pop_front();
    unhash(b);
  } else {
    return -1;
  }
  MD_CHECK(blocks_[b].refcount == 0);
  blocks_[b].refcount = 1;
  ++n_used_;
  return b;
}

void BlockPool::acquire(int block) {
  Block& blk = blocks_.at(block);
  MD_CHECK(!blk.on_free_list, "block ", block, " acquired while free");
  if (blk.refcount == 0) {
    MD_CHECK(blk.hashed, "block ", block, " unreferenced but neither free nor cached");
    lru_.erase(blk.lru_pos);
    ++n_used_;
  }
  ++blk.refcount;
}

void BlockPool::release(int block) {
  Block& blk = blocks_.at(block);
  MD_CHECK(blk.refcount > 0, "block ", block, " released more often than held");
  if (--blk.refcount > 0) return;
  --n_used_;
  if (blk.hashed) {
    blk.lru_pos = lru_.insert(lru_.end(), block);
  } else {
    blk.on_free_list = true;
    free_.push_back(block);
  }
}

int BlockPool::lookup(uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens) const {
  if (!prefix_cache_) return -1;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const Block& blk = blocks_[it->second];
  // The hash is 64 bits; compare what it summarises so a collision cannot return wrong KV
  // (the parent is compared by hash: a wrong match needs a 64-bit collision one block earlier).
  if (blk.parent_hash != parent_hash || !std::equal(tokens.begin(), tokens.end(), blk.tokens.begin(), blk.tokens.end()))
    return -1;
  return it->second;
}

void BlockPool::register_full(int block, uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens) {
  Block& blk = blocks_.at(block);
  MD_CHECK(blk.refcount > 0, "registering unheld block ", block);
  MD_CHECK(static_cast<int>(tokens.size()) == block_size_, "registering a partial block");
  if (!prefix_cache_ || blk.hashed) return;
  if (by_hash_.count(hash) != 0) return;  // another block already caches this prefix
  blk.hashed = true;
  blk.hash = hash;
  blk.parent_hash = parent_hash;
  blk.tokens.assign(tokens.begin(), tokens.end());
  by_hash_.emplace(hash, block);
}

void BlockPool::unhash(int block) {
  Block& blk = blocks_[block];
  MD_CHECK(blk.hashed);
  auto it = by_hash_.find(blk.hash);
  MD_CHECK(it != by_hash_.end() && it->second == block);
  by_hash_.erase(it);
  blk.hashed = false;
  blk.tokens.clear();
}

void BlockPool::check_invariants() const {
  const int n = n_blocks();
  std::vector<int> seen(n, 0);  // 1: free list, 2: LRU
  for (int b : free_) {
    MD_CHECK(b >= 0 && b < n, "free list holds id ", b);
    MD_CHECK(seen[b] == 0, "block ", b, " twice on the free list");
    seen[b] = 1;
  }
  for (int b : lru_) {
    MD_CHECK(b >= 0 && b < n, "LRU holds id ", b);
    MD_CHECK(seen[b] == 0, "block ", b, " on the LRU and another list");
    seen[b] = 2;
  }
  int n_used = 0;
  int n_hashed = 0;
  for (int b = 0; b < n; ++b) {
    const Block& blk = blocks_[b];
    MD_CHECK(blk.refcount >= 0, "block ", b, " refcount ", blk.refcount);
    MD_CHECK(blk.on_free_list == (seen[b] == 1), "block ", b, " free flag disagrees with the free list");
    if (blk.refcount > 0) {
      ++n_used;
      MD_CHECK(seen[b] == 0, "block ", b, " is used and on a list");
    } else if (blk.hashed) {
      MD_CHECK(seen[b] == 2, "block ", b, " is cached but not on the LRU");
      MD_CHECK(*blk.lru_pos == b, "block ", b, " LRU position is stale");
    } else {
      MD_CHECK(seen[b] == 1, "block ", b, " is neither used, cached nor free");
    }
    if (blk.hashed) {
      ++n_hashed;
      MD_CHECK(static_cast<int>(blk.tokens.size()) == block_size_);
      auto it = by_hash_.find(blk.hash);
      MD_CHECK(it != by_hash_.end() && it->second == b, "cached block ", b, " missing from the hash index");
      MD_CHECK(block_chain_hash(blk.parent_hash, blk.tokens) == blk.hash, "block ", b, " hash does not match its tokens");
    }
  }
  MD_CHECK(n_used == n_used_, "used count ", n_used_, " but ", n_used, " blocks are held");
  MD_CHECK(n_hashed == static_cast<int>(by_hash_.size()), "hash index size ", by_hash_.size(), " != ", n_hashed);
  MD_CHECK(static_cast<int>(free_.size() + lru_.size()) + n_used == n, "free + cached + used != all blocks");
}

}  // namespace megadecode
