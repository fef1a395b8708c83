// BlockPool and KvCache: random admissions/growth/commits/frees against a simple model of which
// sequence holds what, with the invariant checker after every mutation; prefix-cache hits,
// LRU eviction order, and exhaustion.
// sanitize: address
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "kv/kv_cache.h"

namespace megadecode {
namespace {

std::vector<int32_t> random_tokens(SplitMix64& rng, int n, int vocab) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.below(vocab));
  return t;
}

TEST(BlockPool, AllocateReleaseExhaust) {
  BlockPool pool(5, 4, true);
  std::vector<int> got;
  for (int i = 0; i < 5; ++i) {
    got.push_back(pool.allocate());
    pool.check_invariants();
  }
  EXPECT_EQ(pool.allocate(), -1);
  EXPECT_EQ(pool.n_available(), 0);
  EXPECT_EQ(pool.n_used(), 5);
  pool.acquire(got[2]);
  pool.release(got[2]);
  EXPECT_EQ(pool.refcount(got[2]), 1);
  for (int b : got) pool.release(b);
  pool.check_invariants();
  EXPECT_EQ(pool.n_available(), 5);
  EXPECT_EQ(pool.n_used(), 0);
}

TEST(BlockPool, CachedBlocksAreFoundThenEvictedOldestFirst) {
  BlockPool pool(3, 2, true);
  std::vector<int32_t> a = {1, 2}, b = {3, 4};
  uint64_t ha = block_chain_hash(kRootHash, a), hb = block_chain_hash(kRootHash, b);
  int x = pool.allocate(), y = pool.allocate();
  pool.register_full(x, ha, kRootHash, a);
  pool.register_full(y, hb, kRootHash, b);
  pool.check_invariants();
  EXPECT_EQ(pool.lookup(ha, kRootHash, a), x);
  EXPECT_EQ(pool.lookup(hb, kRootHash, a), -1);      // tokens differ from what hb summarises
  EXPECT_EQ(pool.lookup(ha, hb, a), -1);             // parent differs
  pool.release(x);  // x released first: evicted first
  pool.release(y);
  pool.check_invariants();
  EXPECT_EQ(pool.n_available(), 3);
  EXPECT_EQ(pool.n_cached_unreferenced(), 2);
  int z = pool.allocate();  // the never-used block comes before any eviction
  EXPECT_NE(z, x);
  EXPECT_NE(z, y);
  EXPECT_EQ(pool.lookup(ha, kRootHash, a), x);
  int w = pool.allocate();  // evicts x
  EXPECT_EQ(w, x);
  EXPECT_EQ(pool.lookup(ha, kRootHash, a), -1);
  EXPECT_EQ(pool.lookup(hb, kRootHash, b), y);
  pool.acquire(y);  // a hit takes y off the LRU
  pool.check_invariants();
  EXPECT_EQ(pool.allocate(), -1);
}

TEST(BlockPool, DisabledCacheNeverHits) {
  BlockPool pool(2, 2, false);
  std::vector<int32_t> a = {1, 2};
  int x = pool.allocate();
  pool.register_full(x, block_chain_hash(kRootHash, a), kRootHash, a);
  pool.release(x);
  pool.check_invariants();
  EXPECT_EQ(pool.lookup(block_chain_hash(kRootHash, a), kRootHash, a), -1);
  EXPECT_EQ(pool.n_cached_unreferenced(), 0);
}

TEST(KvCache, PrefixHitsShareBlocksAndSkipTheLastToken) {
  KvCache kv(16, 4, true);
  std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};  // 2 full blocks + 2
  auto p0 = kv.plan_admission(prompt, 9, 10);
  EXPECT_TRUE(p0.cached_blocks.empty());
  EXPECT_EQ(p0.n_new_blocks, 3);
  EXPECT_EQ(kv.admit(1, p0), 0);
  kv.commit(1, prompt, 9);  // 2 full blocks now hold KV
  kv.check_invariants();
  // Same prompt: both full blocks hit (9 cacheable tokens cover 2 blocks).
  auto p1 = kv.plan_admission(prompt, 9, 10);
  ASSERT_EQ(p1.cached_blocks.size(), 2u);
  EXPECT_EQ(p1.n_new_blocks, 1);
  EXPECT_EQ(p1.n_blocks_needed, 1);  // the hits are held by seq 1, not on the LRU
  EXPECT_EQ(kv.admit(2, p1), 8);
  kv.check_invariants();
  EXPECT_EQ(kv.table(1)[0], kv.table(2)[0]);
  EXPECT_EQ(kv.table(1)[1], kv.table(2)[1]);
  EXPECT_NE(kv.table(1)[2], kv.table(2)[2]);
  // A prompt of exactly 8 tokens may reuse only the first block: its last token is recomputed.
  std::vector<int32_t> eight(prompt.begin(), prompt.begin() + 8);
  auto p2 = kv.plan_admission(eight, 7, 8);
  EXPECT_EQ(p2.cached_blocks.size(), 1u);
  kv.free(1);
  kv.free(2);
  kv.check_invariants();
  EXPECT_EQ(kv.n_used(), 0);
  EXPECT_EQ(kv.pool().n_cached_unreferenced(), 2);
  auto p3 = kv.plan_admission(prompt, 9, 10);
  EXPECT_EQ(p3.cached_blocks.size(), 2u);
  EXPECT_EQ(p3.n_blocks_needed, 3);  // the hits come off the LRU
}

// Random workload against a model: every mutation followed by the invariant checker; a cached
// hit must hold the very tokens the prefix asked for.
TEST(KvCache, RandomWorkloadKeepsInvariants) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int round = 0; round < 20; ++round) {
    const int bs = 1 + static_cast<int>(rng.below(7));
    const int n_blocks = 3 + static_cast<int>(rng.below(40));
    KvCache kv(n_blocks, bs, rng.below(4) != 0);
    // Which tokens each block's KV "holds", as written by whoever computed it.
    std::vector<std::vector<int32_t>> block_content(n_blocks);
    struct Live {
      std::vector<int32_t> tokens;
      int n_computed;
    };
    std::map<int64_t, Live> live;
    std::vector<std::vector<int32_t>> prompts;  // a few shared prefixes make hits likely
    for (int i = 0; i < 4; ++i) prompts.push_back(random_tokens(rng, static_cast<int>(rng.below(4 * bs + 3)) + 1, 5));
    int64_t next_id = 1;
    for (int op = 0; op < 400; ++op) {
      const uint64_t what = rng.below(10);
      if (what < 4) {  // admit
        std::vector<int32_t> t = prompts[rng.below(prompts.size())];
        auto extra = random_tokens(rng, static_cast<int>(rng.below(2 * bs)), 5);
        t.insert(t.end(), extra.begin(), extra.end());
        const int n = static_cast<int>(t.size());
        auto plan = kv.plan_admission(t, n - 1, n);
        if (!kv.fits(plan)) continue;
        const int64_t id = next_id++;
        const int cached = kv.admit(id, plan);
        kv.check_invariants();
        ASSERT_LE(cached, n - 1);
        auto table = kv.table(id);
        for (int b = 0; b < cached / bs; ++b)
          ASSERT_EQ(block_content[table[b]], std::vector<int32_t>(t.begin() + b * bs, t.begin() + (b + 1) * bs));
        live[id] = Live{t, cached};
      } else if (what < 8 && !live.empty()) {  // compute some tokens, maybe grow
        auto it = live.begin();
        std::advance(it, rng.below(live.size()));
        Live& s = it->second;
        if (rng.below(2) == 0) {
          s.tokens.push_back(static_cast<int32_t>(rng.below(5)));
          if (!kv.ensure(it->first, static_cast<int>(s.tokens.size()))) {
            s.tokens.pop_back();
            kv.check_invariants();
            continue;
          }
          kv.check_invariants();
        }
        const int upto = s.n_computed + static_cast<int>(rng.below(s.tokens.size() - s.n_computed + 1));
        auto table = kv.table(it->first);
        for (int p = s.n_computed; p < upto; ++p) {
          auto& content = block_content[table[p / bs]];
          if (p % bs == 0) content.clear();
          ASSERT_EQ(static_cast<int>(content.size()), p % bs) << "writing a block out of order";
          content.push_back(s.tokens[p]);
        }
        s.n_computed = upto;
        kv.commit(it->first, s.tokens, upto);
        kv.check_invariants();
      } else if (!live.empty()) {  // free
        auto it = live.begin();
        std::advance(it, rng.below(live.size()));
        kv.free(it->first);
        live.erase(it);
        kv.check_invariants();
      }
    }
    for (auto& [id, s] : live) kv.free(id);
    kv.check_invariants();
    EXPECT_EQ(kv.n_used(), 0);
    EXPECT_EQ(kv.n_available(), n_blocks);
  }
}

}  // namespace
}  // namespace megadecode
