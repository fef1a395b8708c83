// CPU tests of the batched decode step's index math (src/cuda/batched/batched_plan.h), which its
// kernels and its host side share: the attention splits of a context, the row of a split, the row
// buckets of the step graphs, the block-table stride, and a sliding layer's window and ring entries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "cuda/batched/batched_plan.h"
#include "kv/kv_cache.h"

namespace megadecode::cuda::batched {
namespace {

// Every split is non-empty and whole key tiles long (but the last), the splits cover [0, ctx)
// exactly, there are at most kMaxSplits, and none is shorter than kSplitMinKeys unless the context is.
TEST(BatchedPlan, SplitsCoverTheContextInWholeTiles) {
  for (int ctx = 1; ctx <= 70000; ctx += (ctx < 2000 ? 1 : 97)) {
    const SplitShape s = decode_splits(ctx);
    ASSERT_GE(s.n, 1) << ctx;
    ASSERT_LE(s.n, kMaxSplits) << ctx;
    ASSERT_EQ(s.len % kKeyTile, 0) << ctx;
    ASSERT_GE(s.len * s.n, ctx) << ctx;
    ASSERT_LT(s.len * (s.n - 1), ctx) << "the last split is empty at " << ctx;
    if (ctx >= kSplitMinKeys) {
      ASSERT_GE(s.len, kSplitMinKeys) << ctx;
    }
  }
  EXPECT_EQ(decode_splits(8192).n, 16);
  EXPECT_EQ(decode_splits(8192).len, 512);
  EXPECT_EQ(decode_splits(1024).n, 2);
  EXPECT_EQ(decode_splits(1023).n, 1);
  EXPECT_EQ(decode_splits(1).n, 1);
  EXPECT_EQ(decode_splits(0).n, 0);  // a padding row
  EXPECT_EQ(decode_splits(40960).n, 64);
}

// split_row agrees with a plain scan, padding rows (no splits) included.
TEST(BatchedPlan, SplitRowFindsTheOwner) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu (MEGADECODE_SEED reproduces)\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int rows = 1 + static_cast<int>(rng.below(300));
    std::vector<int32_t> begin(rows + 1, 0);
    for (int r = 0; r < rows; ++r) {
      const int ctx = rng.unit() < 0.2f ? 0 : 1 + static_cast<int>(rng.below(40000));
      begin[r + 1] = begin[r] + decode_splits(ctx).n;
    }
    for (int p = 0; p < begin[rows]; ++p) {
      int want = 0;
      while (!(begin[want] <= p && p < begin[want + 1])) ++want;
      ASSERT_EQ(split_row(begin.data(), rows, p), want) << "trial " << trial << " split " << p;
    }
  }
}

TEST(BatchedPlan, BucketsAndStrides) {
  for (int rows = 1; rows <= 1024; ++rows) {
    const int b = row_bucket(rows);
    ASSERT_GE(b, rows);
    ASSERT_EQ(row_bucket(b), b) << "a bucket is its own bucket";
    ASSERT_LE(b - rows, rows <= 64 ? 7 : rows <= 128 ? 15 : 31) << rows;
  }
  EXPECT_EQ(row_bucket(1), 8);
  EXPECT_EQ(row_bucket(65), 80);
  EXPECT_EQ(row_bucket(200), 224);
  EXPECT_EQ(row_bucket(256), 256);
  EXPECT_EQ(table_stride(1), 16);
  EXPECT_EQ(table_stride(512), 512);
  EXPECT_EQ(table_stride(513), 1024);
}

// A sliding layer's row reads keys [ctx - W, ctx) (cpu-ref: first = pos - W + 1 for the query at
// pos = ctx - 1), all of them below W; a full layer (W = 0) every key.
TEST(BatchedPlan, RowKeysAreTheWindowsLastKeys) {
  for (int window : {0, 1, 24, 4096})
    for (int ctx = 0; ctx <= 9000; ctx += ctx < 50 ? 1 : 97) {
      const RowKeys k = decode_row_keys(ctx, window);
      const int pos = ctx - 1;
      const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
      ASSERT_EQ(k.first, ctx == 0 ? 0 : first) << ctx << " " << window;
      ASSERT_EQ(k.first + k.n, ctx) << ctx << " " << window;
      if (window > 0) {
        ASSERT_LE(k.n, window);
      }
    }
}

// Through a ring of R = kv_ring_length(W, bs) entries, the window's positions (and the new one's)
// land in distinct slots, so appending position ctx never overwrites a key the row still reads;
// without a ring, entry pos / bs.
TEST(BatchedPlan, RingEntriesHoldTheWholeWindow) {
  for (int bs : {1, 5, 16})
    for (int window : {1, 24, 100}) {
      const int R = kv_ring_length(window, bs);
      for (int ctx = 1; ctx <= 4 * R * bs; ++ctx) {
        const RowKeys k = decode_row_keys(ctx, window);
        std::set<std::pair<int, int>> slots;
        for (int p = k.first; p <= ctx; ++p) {  // the window's keys and the appended one
          const int e = table_entry(p, bs, R);
          ASSERT_GE(e, 0);
          ASSERT_LT(e, R);
          ASSERT_TRUE(slots.insert({e, p % bs}).second) << "bs " << bs << " W " << window << " pos " << p;
        }
      }
      EXPECT_EQ(table_entry(37, bs, 0), 37 / bs);
    }
}

}  // namespace
}  // namespace megadecode::cuda::batched
