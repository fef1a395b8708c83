// Sizing the GPU backends' two KV pools (engine/kv_pools.h): each pool's block holds only its own
// layers, the ring pool gets min(full blocks, max_seqs rings), and the budget is spent to the last
// full block. The property the rule exists for, checked on random workloads: any set of at most
// max_seqs sequences whose blocks fit the full pool also fits the ring pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "kv/kv_cache.h"
#include "engine/kv_pools.h"
#include "model/presets.h"

namespace megadecode {
namespace {

constexpr int64_t kLayerBlock = int64_t{2} * 4 * 16 * 128 * 2;  // K and V, 4 KV heads of 128, 16 positions, bf16

TEST(KvPools, EachPoolsBlockHoldsOnlyItsOwnLayers) {
  const KvPoolShape q = kv_pool_shape(preset_config("qwen3-30b-a3b"), 16, 2);
  EXPECT_EQ(q.n_full_layers, 48);
  EXPECT_EQ(q.n_ring_layers, 0);
  EXPECT_EQ(q.ring_length, 0);
  EXPECT_EQ(q.full_block_bytes, 48 * kLayerBlock);
  EXPECT_EQ(q.ring_block_bytes, 0);
  const KvPoolShape n = kv_pool_shape(preset_config("north-mini-code"), 16, 2);
  EXPECT_EQ(n.n_full_layers, 13);  // layers 0, 4, ..., 48
  EXPECT_EQ(n.n_ring_layers, 36);
  EXPECT_EQ(n.ring_length, 257);   // 4096 / 16 + 1
  EXPECT_EQ(n.full_block_bytes, 13 * kLayerBlock);
  EXPECT_EQ(n.ring_block_bytes, 36 * kLayerBlock);
  EXPECT_THROW(kv_pool_shape(preset_config("north-tiny"), 0, 2), Error);
}

TEST(KvPools, WithoutSlidingLayersTheBudgetIsFullBlocks) {
  const KvPoolShape q = kv_pool_shape(preset_config("qwen3-30b-a3b"), 16, 2);
  const double budget = 7.5 * q.full_block_bytes;
  const KvPoolSizes s = size_kv_pools(q, budget, 64);
  EXPECT_EQ(s.n_blocks, 7);
  EXPECT_EQ(s.n_ring_blocks, 0);
  EXPECT_EQ(size_kv_pools(q, budget, 64, 3).n_blocks, 3);  // given: taken as it is
  EXPECT_EQ(size_kv_pools(q, 0.0, 64).n_blocks, 0);
  EXPECT_EQ(size_kv_pools(q, 1e30, 1).n_blocks, int64_t{1} << 30);  // capped
  EXPECT_THROW(size_kv_pools(q, -1.0, 64), Error);
  EXPECT_THROW(size_kv_pools(q, budget, 0), Error);
  EXPECT_THROW(size_kv_pools(q, budget, 64, -1), Error);
}

TEST(KvPools, TheRingPoolHoldsAtMostMaxSeqsRings) {
  const KvPoolShape n = kv_pool_shape(preset_config("north-mini-code"), 16, 2);
  const int64_t f = n.full_block_bytes, r = n.ring_block_bytes;
  // A small budget: a ring block beside each full block.
  KvPoolSizes s = size_kv_pools(n, 1000.5 * static_cast<double>(f + r), 64);
  EXPECT_EQ(s.n_blocks, 1000);
  EXPECT_EQ(s.n_ring_blocks, 1000);
  // A large one: 4 rings for 4 sequences, every other byte full blocks.
  const double big = 100000.0 * static_cast<double>(f);
  s = size_kv_pools(n, big, 4);
  EXPECT_EQ(s.n_ring_blocks, 4 * 257);
  EXPECT_EQ(s.n_blocks, (static_cast<int64_t>(big) - 4 * 257 * r) / f);
  // Given pools.
  s = size_kv_pools(n, 0.0, 4, 5000);
  EXPECT_EQ(s.n_blocks, 5000);
  EXPECT_EQ(s.n_ring_blocks, 4 * 257);
  s = size_kv_pools(n, 0.0, 64, 300);
  EXPECT_EQ(s.n_ring_blocks, 300);
  // Never less than one ring: a short `generate` (7 full blocks) still gets a whole ring.
  s = size_kv_pools(n, 0.0, 64, 7);
  EXPECT_EQ(s.n_ring_blocks, 257);
  s = size_kv_pools(n, 200.0 * static_cast<double>(f + r), 64);  // below one ring per full block
  EXPECT_EQ(s.n_ring_blocks, 257);
  EXPECT_EQ(s.n_blocks, static_cast<int64_t>((200.0 * static_cast<double>(f + r) - 257.0 * r) / f));  // 42
  s = size_kv_pools(n, big, 4, 0, 77);
  EXPECT_EQ(s.n_ring_blocks, 77);
  EXPECT_EQ(s.n_blocks, (static_cast<int64_t>(big) - 77 * r) / f);
  s = size_kv_pools(n, 10.0 * static_cast<double>(r), 4, 0, 77);  // the given ring takes the whole budget
  EXPECT_EQ(s.n_blocks, 0);
  EXPECT_EQ(s.n_ring_blocks, 77);
}

// Random shapes, budgets and workloads: the pools fit the budget, one more full block would not,
// and every set of <= max_seqs sequences the full pool holds, the ring pool holds too.
TEST(KvPools, TheRingNeverRefusesWhatTheFullPoolTakes) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int trial = 0; trial < 2000; ++trial) {
    const int bs = 1 + static_cast<int>(rng.below(32)), window = 1 + static_cast<int>(rng.below(300));
    KvPoolShape sh;
    sh.n_full_layers = 1 + static_cast<int>(rng.below(20));
    sh.n_ring_layers = 1 + static_cast<int>(rng.below(40));
    sh.ring_length = kv_ring_length(window, bs);
    sh.full_block_bytes = sh.n_full_layers * (1 + static_cast<int64_t>(rng.below(4096)));
    sh.ring_block_bytes = sh.n_ring_layers * (1 + static_cast<int64_t>(rng.below(4096)));
    const int max_seqs = 1 + static_cast<int>(rng.below(64));
    const double budget = static_cast<double>(rng.below(uint64_t{1} << 34));
    const KvPoolSizes s = size_kv_pools(sh, budget, max_seqs);
    ASSERT_GE(s.n_ring_blocks, sh.ring_length) << "trial " << trial << ": less than one ring";
    if (budget >= static_cast<double>(sh.ring_length * sh.ring_block_bytes)) {  // room for one ring
      ASSERT_LE(static_cast<double>(s.bytes(sh)), budget) << "trial " << trial;
    }
    KvPoolSizes more = s;
    ++more.n_blocks;
    more.n_ring_blocks =
        std::max<int64_t>(sh.ring_length, std::min<int64_t>(more.n_blocks, int64_t{max_seqs} * sh.ring_length));
    if (s.n_blocks < int64_t{1} << 30) {  // below the cap
      ASSERT_GT(static_cast<double>(more.bytes(sh)), budget) << "trial " << trial << ": a full block left unbought";
    }
    ASSERT_LE(s.n_ring_blocks, int64_t{max_seqs} * sh.ring_length);
    // Sequences of random lengths, as many as the full pool and max_seqs allow.
    int64_t full = 0, ring = 0;
    for (int q = 0; q < max_seqs; ++q) {
      const int64_t blocks = 1 + static_cast<int64_t>(rng.below(4 * static_cast<uint64_t>(sh.ring_length)));
      if (full + blocks > s.n_blocks) break;
      full += blocks;
      ring += std::min<int64_t>(blocks, sh.ring_length);
    }
    ASSERT_LE(ring, s.n_ring_blocks) << "trial " << trial << ": the ring pool refuses what the full pool takes";
  }
}

// More sequences fit: North Mini Code at 32K contexts in 60 GiB, 64 sequences at most.
// Its full pool keeps 13 layers a block, not 49, and its ring pool at most 64 rings, so ~4.6 times
// as many 32K sequences fit as when the full pool kept every layer with a ring block beside each.
TEST(KvPools, NorthFitsFourTimesTheLongSequences) {
  const KvPoolShape n = kv_pool_shape(preset_config("north-mini-code"), 16, 2);
  const double budget = 60.0 * (1 << 30);
  const int per_seq = 32768 / 16;
  const KvPoolSizes s = size_kv_pools(n, budget, 64);
  const int64_t fit = std::min({s.n_blocks / per_seq, s.n_ring_blocks / n.ring_length, int64_t{64}});
  // Every layer in the full pool, a ring block beside each full block.
  const int64_t all_layers = 49 * kLayerBlock;
  const auto old_blocks = static_cast<int64_t>(budget / static_cast<double>(all_layers + n.ring_block_bytes));
  const int64_t old_fit = old_blocks / per_seq;
  std::printf("32K sequences in 60 GiB: %lld (full pool %lld blocks, ring %lld), before %lld\n",
              static_cast<long long>(fit), static_cast<long long>(s.n_blocks), static_cast<long long>(s.n_ring_blocks),
              static_cast<long long>(old_fit));
  EXPECT_EQ(old_fit, 11);
  EXPECT_EQ(fit, 51);
}

}  // namespace
}  // namespace megadecode
