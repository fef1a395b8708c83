// Host tests of the attention state (cuda/common/attention_state.cuh), the arithmetic every
// attention kernel shares: the online-softmax step over tiles equals the softmax computed at once
// (in double), a log-sum-exp merge of split partials equals the unsplit state, empty tiles and
// empty partials contribute nothing and never make a NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/rng.h"
#include "cuda/common/attention_state.cuh"

namespace megadecode::cuda {
namespace {

// A row's state (m, l, o) over scores [begin, end) (log2 domain) and one value per key, tile by
// tile as the kernels run it: o = o * alpha + sum 2^(s - m_use) v, l = l * alpha + sum 2^(s - m_use).
AttnPartial online(const std::vector<float>& s, const std::vector<float>& v, int begin, int end, int tile) {
  float m = -INFINITY, l = 0.0f, o = 0.0f;
  for (int t0 = begin; t0 < end; t0 += tile) {
    const int t1 = std::min(end, t0 + tile);
    float tile_max = -INFINITY;
    for (int j = t0; j < t1; ++j) tile_max = std::max(tile_max, s[j]);
    const AttnRescale r = attn_rescale(m, tile_max);
    float sum = 0.0f, pv = 0.0f;
    for (int j = t0; j < t1; ++j) {
      const float p = std::exp2(s[j] - r.m_use);
      sum += p;
      pv += p * v[j];
    }
    l = l * r.alpha + sum;
    o = o * r.alpha + pv;
  }
  return {m, l, o};
}

// sum_j softmax(s)_j v_j in double (base 2).
double exact(const std::vector<float>& s, const std::vector<float>& v) {
  double mx = -INFINITY;
  for (float x : s) mx = std::max(mx, static_cast<double>(x));
  double num = 0, den = 0;
  for (size_t j = 0; j < s.size(); ++j) {
    const double p = std::exp2(s[j] - mx);
    num += p * v[j];
    den += p;
  }
  return num / den;
}

TEST(AttentionState, OnlineStepsAndSplitMergesEqualTheWholeSoftmax) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng.below(3000));
    std::vector<float> s(n), v(n);
    for (int j = 0; j < n; ++j) {
      s[j] = rng.below(8) == 0 ? -INFINITY : static_cast<float>(rng.normal() * 6.0);  // masked keys too
      v[j] = static_cast<float>(rng.normal());
    }
    s[rng.below(n)] = static_cast<float>(rng.normal());  // at least one key
    const double want = exact(s, v);
    const int tile = 1 + static_cast<int>(rng.below(300));
    const AttnPartial whole = online(s, v, 0, n, tile);
    EXPECT_NEAR(attn_normalise(whole.o, whole.l), want, 1e-5 * (1 + std::fabs(want))) << "n " << n << " tile " << tile;
    // Split into ragged partials (some possibly empty), merged in split order.
    std::vector<AttnPartial> parts;
    for (int b = 0; b < n;) {
      const int e = std::min(n, b + static_cast<int>(rng.below(n + 1)));
      parts.push_back(online(s, v, b, e, tile));
      b = e;
    }
    parts.push_back({-INFINITY, 0.0f, 0.0f});  // an empty split
    float m, l;
    const float o = attn_merge(static_cast<int>(parts.size()), [&](int i) { return parts[i].m; },
                               [&](int i) { return parts[i]; }, m, l);
    EXPECT_EQ(m, whole.m);
    EXPECT_NEAR(attn_normalise(o, l), want, 1e-5 * (1 + std::fabs(want))) << "n " << n << " " << parts.size() << " parts";
  }
}

TEST(AttentionState, EmptyTilesAndPartialsContributeNothing) {
  // Partials (m, l, o) in the log2 domain; an empty one (m = -inf) contributes nothing.
  const AttnPartial parts[3] = {{-INFINITY, 0.0f, 0.0f}, {1.0f, 2.0f, 4.0f}, {3.0f, 1.0f, 1.0f}};
  float m, l;
  const float o = attn_merge(3, [&](int i) { return parts[i].m; }, [&](int i) { return parts[i]; }, m, l);
  EXPECT_EQ(m, 3.0f);
  EXPECT_FLOAT_EQ(l, 2.0f * 0.25f + 1.0f);
  EXPECT_FLOAT_EQ(o, 4.0f * 0.25f + 1.0f);
  float mm = -INFINITY;
  const AttnRescale r0 = attn_rescale(mm, -INFINITY);  // a tile with every key masked, first
  EXPECT_EQ(r0.m_use, 0.0f);
  EXPECT_EQ(r0.alpha, 0.0f);
  EXPECT_EQ(mm, -INFINITY);
  const AttnRescale r1 = attn_rescale(mm, 2.0f);
  EXPECT_EQ(r1.alpha, 0.0f);
  EXPECT_EQ(mm, 2.0f);
  const AttnRescale r2 = attn_rescale(mm, 1.0f);
  EXPECT_EQ(r2.alpha, 1.0f);
  EXPECT_EQ(r2.m_use, 2.0f);
  // Nothing at all: a zero output, not a NaN.
  const AttnPartial none[2] = {{-INFINITY, 0.0f, 0.0f}, {-INFINITY, 0.0f, 0.0f}};
  const float o0 = attn_merge(2, [&](int i) { return none[i].m; }, [&](int i) { return none[i]; }, m, l);
  EXPECT_EQ(attn_normalise(o0, l), 0.0f);
  EXPECT_EQ(attn_normalise(1.0f, 0.0f), 0.0f);
}

}  // namespace
}  // namespace megadecode::cuda
