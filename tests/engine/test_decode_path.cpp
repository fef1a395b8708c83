// The decode path policy (engine/decode_path.h): the crossover derived from both paths' measured step
// times, on the H100 figures that set it (2026-12-06 device call 1, docs/perf/journal/2026-12.md
// "Megakernel v4: the H100 first"; bench/results/index.json lists the current H100 files) and on
// random step times against a brute-force reading of the rule.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "engine/decode_path.h"

namespace megadecode {
namespace {

TEST(DecodePath, CrossoverOfTheH100Measurements) {
  // qwen3-30b-a3b, 8K, batches 1..8 (ms): the megakernel wins at 1 and 2, the batched step from 3.
  const std::vector<double> q_mk{4.611, 6.994, 9.518, 11.833, 13.904, 16.153, 18.179, 20.178};
  const std::vector<double> q_b{6.045, 7.355, 8.593, 9.706, 11.669, 12.627, 13.561, 14.364};
  EXPECT_EQ(DecodePathPolicy::crossover_from(q_mk, q_b), 3);
  // north-mini-code: the megakernel wins to batch 3, the batched step from 4.
  const std::vector<double> n_mk{4.340, 6.702, 8.238, 10.020, 12.409, 13.944, 16.147, 17.354};
  const std::vector<double> n_b{5.978, 7.196, 8.522, 9.494, 10.808, 11.685, 12.535, 13.335};
  EXPECT_EQ(DecodePathPolicy::crossover_from(n_mk, n_b), 4);
  DecodePathPolicy p;
  p.batched_from_batch = DecodePathPolicy::crossover_from(n_mk, n_b);
  for (int b = 1; b <= 8; ++b)
    EXPECT_EQ(p.choose(b), n_b[b - 1] < n_mk[b - 1] ? DecodePath::kBatched : DecodePath::kMegakernel) << b;
  EXPECT_EQ(p.choose(65), DecodePath::kBatched);
}

TEST(DecodePath, CrossoverIsTheStartOfTheBatchedTail) {
  // The megakernel faster everywhere: batched only beyond the measured batches.
  EXPECT_EQ(DecodePathPolicy::crossover_from(std::vector<double>{1, 2, 3}, std::vector<double>{2, 3, 4}), 4);
  // The batched step faster everywhere: from batch 1.
  EXPECT_EQ(DecodePathPolicy::crossover_from(std::vector<double>{2, 3}, std::vector<double>{1, 2}), 1);
  // A batched win below a megakernel win does not count: the tail starts after the last loss.
  EXPECT_EQ(DecodePathPolicy::crossover_from(std::vector<double>{5, 5, 5, 5}, std::vector<double>{4, 6, 4, 4}), 3);
  // A tie goes to the megakernel (the batched step must be faster).
  EXPECT_EQ(DecodePathPolicy::crossover_from(std::vector<double>{1, 2}, std::vector<double>{1, 2}), 3);
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int round = 0; round < 200; ++round) {
    const int n = 1 + static_cast<int>(rng.below(12));
    std::vector<double> mk(n), b(n);
    for (int i = 0; i < n; ++i) {
      mk[i] = 1 + static_cast<double>(rng.below(20));
      b[i] = 1 + static_cast<double>(rng.below(20));
    }
    const int from = DecodePathPolicy::crossover_from(mk, b);
    ASSERT_GE(from, 1);
    ASSERT_LE(from, n + 1);
    for (int i = from; i <= n; ++i) EXPECT_LT(b[i - 1], mk[i - 1]) << "seed " << seed << " round " << round;
    if (from > 1) {
      EXPECT_GE(b[from - 2], mk[from - 2]) << "seed " << seed << " round " << round;
    }
  }
}

TEST(DecodePath, CrossoverRefusesBadTimes) {
  EXPECT_THROW(DecodePathPolicy::crossover_from(std::vector<double>{}, std::vector<double>{}), Error);
  EXPECT_THROW(DecodePathPolicy::crossover_from(std::vector<double>{1, 2}, std::vector<double>{1}), Error);
  EXPECT_THROW(DecodePathPolicy::crossover_from(std::vector<double>{1, 0}, std::vector<double>{1, 1}), Error);
  EXPECT_THROW(DecodePathPolicy::crossover_from(std::vector<double>{1, 1}, std::vector<double>{1, -2}), Error);
}

}  // namespace
}  // namespace megadecode
