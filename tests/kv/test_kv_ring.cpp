// KvCache's ring pool (sliding-window layers): a sequence's ring grows lazily to R blocks
// and never past them, both pools are counted, fits() and ensure() look at both, freeing returns
// both, the prefix cache is off with rings; a random workload against a model of who holds what,
// with the invariant checker after every mutation.
// sanitize: address
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "kv/kv_cache.h"

namespace megadecode {
namespace {

TEST(KvRing, LengthCoversTheWindowPlusTheBlockBeingWritten) {
  EXPECT_EQ(kv_ring_length(0, 16), 0);
  EXPECT_EQ(kv_ring_length(4096, 16), 257);
  EXPECT_EQ(kv_ring_length(8, 4), 3);
  EXPECT_EQ(kv_ring_length(9, 4), 4);
  EXPECT_EQ(kv_ring_length(1, 4), 2);
  // The property the length exists for: the block position p writes holds no key of p's window.
  for (int w = 1; w <= 40; ++w)
    for (int b = 1; b <= 12; ++b) {
      const int r = kv_ring_length(w, b);
      for (int p = 0; p < 6 * r * b; ++p) {
        // Keys [p - w + 1, p] must map to distinct (ring block, slot) pairs.
        std::vector<int> seen;
        for (int k = std::max(0, p - w + 1); k <= p; ++k) seen.push_back((k / b) % r * b + k % b);
        std::sort(seen.begin(), seen.end());
        ASSERT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "w " << w << " b " << b << " p " << p;
      }
    }
  EXPECT_THROW(kv_ring_length(-1, 4), Error);
  EXPECT_THROW(kv_ring_length(8, 0), Error);
}

TEST(KvRing, ConstructorRefusesHalfARingPool) {
  EXPECT_THROW(KvCache(8, 4, true, 8, 0), Error);
  EXPECT_THROW(KvCache(8, 4, true, 0, 3), Error);
  EXPECT_THROW(KvCache(8, 4, true, -1, 3), Error);
  EXPECT_THROW(KvCache(8, 4, true, 2, 3), Error) << "no room for one whole ring";
  EXPECT_NO_THROW(KvCache(8, 4, true, 3, 3));
  KvCache none(8, 4, true);
  EXPECT_EQ(none.n_ring_blocks(), 0);
  EXPECT_EQ(none.ring_length(), 0);
  EXPECT_TRUE(none.prefix_cache_enabled());
}

TEST(KvRing, RingGrowsLazilyToRBlocksAndNeverMore) {
  const int bs = 4, r = 3;
  KvCache kv(64, bs, true, 16, r);
  const std::vector<int32_t> prompt(5, 7);
  KvAdmission plan = kv.plan_admission(prompt, 4, 5);
  EXPECT_EQ(plan.n_ring_blocks, 2);
  ASSERT_TRUE(kv.fits(plan));
  kv.admit(1, plan);
  kv.check_invariants();
  EXPECT_EQ(kv.table(1).size(), 2u);
  EXPECT_EQ(kv.ring_table(1).size(), 2u);
  EXPECT_EQ(kv.n_ring_used(), 2);
  std::vector<int32_t> ring_at_r;
  for (int n = 6; n <= 200; ++n) {
    ASSERT_TRUE(kv.ensure(1, n));
    kv.check_invariants();
    EXPECT_EQ(static_cast<int>(kv.table(1).size()), kv.blocks_for(n));
    EXPECT_EQ(static_cast<int>(kv.ring_table(1).size()), std::min(kv.blocks_for(n), r));
    if (static_cast<int>(kv.ring_table(1).size()) == r) {
      const std::vector<int32_t> now(kv.ring_table(1).begin(), kv.ring_table(1).end());
      if (ring_at_r.empty()) ring_at_r = now;
      EXPECT_EQ(now, ring_at_r) << "the ring's blocks changed at " << n << " positions";
    }
  }
  EXPECT_EQ(kv.n_ring_used(), r);
  EXPECT_EQ(kv.n_used(), 50);
  kv.free(1);
  kv.check_invariants();
  EXPECT_EQ(kv.n_used(), 0);
  EXPECT_EQ(kv.n_ring_used(), 0);
  EXPECT_EQ(kv.n_ring_available(), 16);
}

// A hit would skip computing the cached tokens, whose sliding layers' K/V is kept nowhere: with a
// ring pool nothing hits. The same workload without rings hits (the control).
TEST(KvRing, PrefixCacheIsOffWithRings) {
  for (int ring : {0, 1}) {
    KvCache kv(64, 4, true, ring ? 64 : 0, ring ? 3 : 0);
    EXPECT_EQ(kv.prefix_cache_enabled(), ring == 0);
    std::vector<int32_t> prompt(17);
    for (int i = 0; i < 17; ++i) prompt[i] = 100 + i;
    kv.admit(1, kv.plan_admission(prompt, 16, 17));
    kv.commit(1, prompt, 16);
    kv.free(1);
    kv.check_invariants();
    const KvAdmission again = kv.plan_admission(prompt, 16, 17);
    EXPECT_EQ(again.cached_blocks.size(), ring ? 0u : 4u);
    EXPECT_EQ(kv.admit(2, again), ring ? 0 : 16);
    kv.check_invariants();
  }
}

TEST(KvRing, EitherPoolRunningDryRefusesAndChangesNothing) {
  const int bs = 4, r = 3;
  KvCache kv(64, bs, false, 4, r);  // room for one full ring and one block more
  const std::vector<int32_t> a(20, 1), b(9, 2);
  kv.admit(1, kv.plan_admission(a, 0, 20));  // 5 full blocks, ring 3
  EXPECT_EQ(kv.n_ring_available(), 1);
  const KvAdmission pb = kv.plan_admission(b, 0, 9);  // 3 full blocks, ring 3
  EXPECT_EQ(pb.n_ring_blocks, 3);
  EXPECT_LE(pb.n_blocks_needed, kv.n_available());
  EXPECT_FALSE(kv.fits(pb)) << "the ring pool is the one short";
  kv.admit(2, kv.plan_admission(b, 0, 4));  // 1 block of each
  kv.check_invariants();
  EXPECT_EQ(kv.n_ring_available(), 0);
  const size_t full_before = kv.table(2).size();
  EXPECT_FALSE(kv.ensure(2, 5)) << "a second ring block for sequence 2 does not exist";
  EXPECT_EQ(kv.table(2).size(), full_before);
  EXPECT_EQ(kv.ring_table(2).size(), 1u);
  EXPECT_TRUE(kv.ensure(1, 200)) << "a full ring needs no more ring blocks";
  kv.check_invariants();
  kv.free(1);
  EXPECT_TRUE(kv.ensure(2, 5));
  kv.check_invariants();
  // The full pool dry, the ring pool not: refused as well.
  KvCache small(3, bs, false, 8, r);
  small.admit(3, small.plan_admission(a, 0, 12));
  EXPECT_FALSE(small.ensure(3, 13));
  EXPECT_EQ(small.ring_table(3).size(), 3u);
  EXPECT_EQ(small.table(3).size(), 3u);
}

// Random admissions, growth and frees over both pools against a model of each sequence's
// positions; the checker after every mutation, the pools' counts against the model.
TEST(KvRing, RandomWorkloadKeepsBothPoolsConsistent) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int round = 0; round < 20; ++round) {
    const int bs = 1 + static_cast<int>(rng.below(6));
    const int window = 1 + static_cast<int>(rng.below(30));
    const int r = kv_ring_length(window, bs);
    KvCache kv(20 + static_cast<int>(rng.below(60)), bs, rng.below(2) == 0, r + static_cast<int>(rng.below(40)), r);
    std::map<int64_t, int> positions;
    int64_t next = 1;
    for (int op = 0; op < 300; ++op) {
      const int what = static_cast<int>(rng.below(3));
      if (what == 0 || positions.empty()) {
        const int n = 1 + static_cast<int>(rng.below(60));
        std::vector<int32_t> tokens(n);
        for (auto& t : tokens) t = static_cast<int32_t>(rng.below(3));
        const KvAdmission plan = kv.plan_admission(tokens, n - 1, n);
        if (!kv.fits(plan)) continue;
        kv.admit(next, plan);
        positions[next++] = n;
      } else {
        auto it = positions.begin();
        std::advance(it, rng.below(positions.size()));
        if (what == 1) {
          const int n = it->second + 1 + static_cast<int>(rng.below(3 * bs));
          if (kv.ensure(it->first, n)) it->second = n;
        } else {
          kv.free(it->first);
          positions.erase(it);
        }
      }
      kv.check_invariants();
      int ring_held = 0;
      for (const auto& [id, n] : positions) {
        ASSERT_GE(static_cast<int>(kv.table(id).size()), kv.blocks_for(n));
        ASSERT_EQ(static_cast<int>(kv.ring_table(id).size()), std::min(static_cast<int>(kv.table(id).size()), r));
        ring_held += static_cast<int>(kv.ring_table(id).size());
      }
      ASSERT_EQ(kv.n_ring_used(), ring_held);
      ASSERT_EQ(kv.n_ring_used() + kv.n_ring_available(), kv.n_ring_blocks());
    }
    for (const auto& [id, n] : positions) kv.free(id);
    kv.check_invariants();
    EXPECT_EQ(kv.n_used(), 0);
    EXPECT_EQ(kv.n_ring_used(), 0);
  }
}

}  // namespace
}  // namespace megadecode
