// KvCache: block tables on top of BlockPool (see kv_cache.h).
#include "kv/kv_cache.h"

#include <algorithm>

#include "core/check.h"

namespace megadecode {

int kv_ring_length(int window, int block_size) {
  MD_REQUIRE(window >= 0, "sliding window must be >= 0, got ", window);
  MD_REQUIRE(block_size > 0, "KV block size must be positive, got ", block_size);
  return window == 0 ? 0 : (window + block_size - 1) / block_size + 1;
}

// The prefix cache is off with a ring pool (kv_cache.h says why).
KvCache::KvCache(int n_blocks, int block_size, bool enable_prefix_cache, int n_ring_blocks, int ring_length)
    : pool_(n_blocks, block_size, enable_prefix_cache && ring_length == 0), ring_length_(ring_length) {
  MD_REQUIRE(n_ring_blocks >= 0 && ring_length >= 0 && (n_ring_blocks > 0) == (ring_length > 0),
             "KV ring pool: blocks (", n_ring_blocks, ") and ring length (", ring_length,
             ") must both be 0 (no sliding layers) or both positive");
  // Fewer blocks than one ring: a sequence past n_ring_blocks * block_size positions could never run.
  MD_REQUIRE(n_ring_blocks >= ring_length, "KV ring pool of ", n_ring_blocks, " blocks holds no whole ring of ",
             ring_length, " blocks (the sliding window over blocks of ", block_size, " tokens)");
  if (ring_length > 0) ring_.emplace(n_ring_blocks, block_size, false);
}

KvAdmission KvCache::plan_admission(std::span<const int32_t> tokens, int max_cached_tokens, int n_positions) const {
  KvAdmission plan;
  const int bs = block_size();
  const int n_cacheable = std::min<int>(max_cached_tokens, static_cast<int>(tokens.size())) / bs;
  uint64_t parent = kRootHash;
  int n_on_lru = 0;
  for (int i = 0; i < n_cacheable && pool_.prefix_cache_enabled(); ++i) {
    auto block_tokens = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    uint64_t h = block_chain_hash(parent, block_tokens);
    int b = pool_.lookup(h, parent, block_tokens);
    if (b < 0) break;
    plan.cached_blocks.push_back(b);
    plan.cached_hashes.push_back(h);
    if (pool_.refcount(b) == 0) ++n_on_lru;
    parent = h;
  }
  plan.n_new_blocks = std::max(0, blocks_for(n_positions) - static_cast<int>(plan.cached_blocks.size()));
  plan.n_blocks_needed = plan.n_new_blocks + n_on_lru;
  plan.n_ring_blocks = ring_blocks_for(n_positions);
  return plan;
}

int KvCache::admit(int64_t seq, const KvAdmission& plan) {
  MD_CHECK(!has(seq), "sequence ", seq, " admitted twice");
  MD_CHECK(fits(plan), "admitting a plan that does not fit");
  SeqBlocks s;
  // Take the hits first so that allocating the new blocks cannot evict them.
  for (int b : plan.cached_blocks) {
    pool_.acquire(b);
    s.table.push_back(b);
  }
  for (int i = 0; i < plan.n_new_blocks; ++i) {
    int b = pool_.allocate();
    MD_CHECK(b >= 0, "pool ran out during an admission that fit");
    s.table.push_back(b);
  }
  for (int i = 0; i < plan.n_ring_blocks; ++i) {
    int b = ring_->allocate();
    MD_CHECK(b >= 0, "ring pool ran out during an admission that fit");
    s.ring.push_back(b);
  }
  s.n_committed = static_cast<int>(plan.cached_blocks.size());
  s.last_hash = plan.cached_hashes.empty() ? kRootHash : plan.cached_hashes.back();
  seqs_.emplace(seq, std::move(s));
  return static_cast<int>(plan.cached_blocks.size()) * block_size();
}

bool KvCache::ensure(int64_t seq, int n_positions) {
  SeqBlocks& s = seqs_.at(seq);
  const int need = std::max(0, blocks_for(n_positions) - static_cast<int>(s.table.size()));
  const int need_ring = std::max(0, ring_blocks_for(n_positions) - static_cast<int>(s.ring.size()));
  if (need > n_available() || need_ring > n_ring_available()) return false;
  for (int i = 0; i < need; ++i) s.table.push_back(pool_.allocate());
  for (int i = 0; i < need_ring; ++i) s.ring.push_back(ring_->allocate());
  return true;
}

void KvCache::commit(int64_t seq, std::span<const int32_t> tokens, int n_computed) {
  SeqBlocks& s = seqs_.at(seq);
  const int bs = block_size();
  MD_CHECK(n_computed <= static_cast<int>(tokens.size()));
  const int n_full = std::min<int>(n_computed / bs, static_cast<int>(s.table.size()));
  for (; s.n_committed < n_full; ++s.n_committed) {
    auto block_tokens = tokens.subspan(static_cast<size_t>(s.n_committed) * bs, bs);
    uint64_t h = block_chain_hash(s.last_hash, block_tokens);
    pool_.register_full(s.table[s.n_committed], h, s.last_hash, block_tokens);
    s.last_hash = h;
  }
}

void KvCache::free(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // Release the tail first so that, among equally old cached blocks, a prefix's later blocks are
  // evicted before its earlier ones (an earlier block is useful without the later ones).
  for (auto b = it->second.table.rbegin(); b != it->second.table.rend(); ++b) pool_.release(*b);
  for (int b : it->second.ring) ring_->release(b);
  seqs_.erase(it);
}

std::span<const int32_t> KvCache::table(int64_t seq) const { return seqs_.at(seq).table; }
std::span<const int32_t> KvCache::ring_table(int64_t seq) const { return seqs_.at(seq).ring; }

void KvCache::check_invariants() const {
  pool_.check_invariants();
  std::vector<int> holders(pool_.n_blocks(), 0);
  for (const auto& [id, s] : seqs_) {
    std::vector<int32_t> sorted = s.table;
    std::sort(sorted.begin(), sorted.end());
    MD_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), "sequence ", id, " holds a block twice");
    for (int b : s.table) {
      MD_CHECK(b >= 0 && b < pool_.n_blocks(), "sequence ", id, " holds block id ", b);
      ++holders[b];
    }
    MD_CHECK(s.n_committed <= static_cast<int>(s.table.size()));
  }
  for (int b = 0; b < pool_.n_blocks(); ++b)
    MD_CHECK(holders[b] == pool_.refcount(b), "block ", b, " refcount ", pool_.refcount(b), " but ", holders[b],
             " tables hold it");
  if (!ring_) {
    for (const auto& [id, s] : seqs_) MD_CHECK(s.ring.empty(), "sequence ", id, " holds ring blocks without a ring pool");
    return;
  }
  // Ring blocks are never shared: each is held by exactly one ring.
  ring_->check_invariants();
  std::vector<int> ring_holders(ring_->n_blocks(), 0);
  for (const auto& [id, s] : seqs_) {
    const int want = std::min(static_cast<int>(s.table.size()), ring_length_);
    MD_CHECK(static_cast<int>(s.ring.size()) == want, "sequence ", id, " holds ", s.ring.size(), " ring blocks for ",
             s.table.size(), " full blocks (ring length ", ring_length_, ")");
    for (int b : s.ring) {
      MD_CHECK(b >= 0 && b < ring_->n_blocks(), "sequence ", id, " holds ring block id ", b);
      ++ring_holders[b];
    }
  }
  for (int b = 0; b < ring_->n_blocks(); ++b)
    MD_CHECK(ring_holders[b] == ring_->refcount(b) && ring_holders[b] <= 1, "ring block ", b, " refcount ",
             ring_->refcount(b), " but ", ring_holders[b], " rings hold it");
}

}  // namespace megadecode
