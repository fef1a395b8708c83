// Tests of core/stats.h: the median of odd, even and empty sample sets in any order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/rng.h"
#include "core/stats.h"

namespace megadecode {
namespace {

TEST(Stats, MedianOfAnyOrder) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  EXPECT_EQ(median({}), 0.0);
  EXPECT_EQ(median({3.0}), 3.0);
  EXPECT_EQ(median({5.0, 1.0}), 3.0);
  EXPECT_EQ(median({3.0, 1.0, 100.0, 2.0, 2.0}), 2.0);  // an outlier does not move it
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(rng.below(40));
    std::vector<double> v(n);
    for (double& x : v) x = static_cast<double>(rng.below(1000));
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    const double want = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    for (int i = n - 1; i > 0; --i) std::swap(v[i], v[rng.below(i + 1)]);
    EXPECT_EQ(median(v), want) << "n " << n;
  }
}

}  // namespace
}  // namespace megadecode
