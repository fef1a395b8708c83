// token_logprob against a double-precision log-softmax and a full sort: random rows of awkward
// lengths (below, at and past the 8-lane blocks and the 512-value sum blocks, and a whole Qwen3
// vocabulary row), logits far below the maximum (exp underflow), ties (to the lower id), NaN
// (every logprob NaN, NaN ranked last), -inf entries and an all -inf row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/rng.h"
#include "engine/logits.h"

namespace megadecode {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

uint64_t printed_seed() {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

// The reference: log-softmax in double, and the order larger first, ties to the lower id, NaN last.
struct Reference {
  std::vector<double> logprob;
  std::vector<int32_t> order;
};

Reference reference(const std::vector<float>& x) {
  Reference r;
  double m = -INFINITY;
  for (float v : x)
    if (!std::isnan(v)) m = std::max(m, static_cast<double>(v));
  double z = 0;
  for (float v : x)
    if (!std::isnan(v) && std::isfinite(m)) z += std::exp(static_cast<double>(v) - m);
  for (float v : x) r.logprob.push_back(std::isfinite(m) ? static_cast<double>(v) - (m + std::log(z)) : -INFINITY);
  r.order.resize(x.size());
  std::iota(r.order.begin(), r.order.end(), 0);
  auto key = [&](int32_t i) { return std::isnan(x[i]) ? -kInf : x[i]; };
  std::stable_sort(r.order.begin(), r.order.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
  return r;
}

void expect_matches(const std::vector<float>& x, int top, const char* what) {
  SCOPED_TRACE(::testing::Message() << what << ", " << x.size() << " logits, top " << top);
  const Reference ref = reference(x);
  for (int32_t token : {0, static_cast<int32_t>(x.size()) / 2, static_cast<int32_t>(x.size()) - 1}) {
    const TokenLogprob got = token_logprob(x, token, top);
    EXPECT_EQ(got.token, token);
    if (std::isinf(ref.logprob[token])) {
      EXPECT_EQ(got.logprob, -kInf);
    } else {
      EXPECT_NEAR(got.logprob, ref.logprob[token], 2e-6 * std::max(1.0, std::abs(ref.logprob[token])));
    }
    const int want_top = std::min<int>(top, static_cast<int>(x.size()));
    ASSERT_EQ(static_cast<int>(got.top.size()), want_top);
    for (int k = 0; k < want_top; ++k) {
      EXPECT_EQ(got.top[k].token, ref.order[k]) << "rank " << k;
      const double want = ref.logprob[ref.order[k]];
      if (std::isinf(want)) EXPECT_EQ(got.top[k].logprob, -kInf) << "rank " << k;
      else EXPECT_NEAR(got.top[k].logprob, want, 2e-6 * std::max(1.0, std::abs(want))) << "rank " << k;
    }
  }
}

TEST(TokenLogprob, MatchesTheDoubleLogSoftmaxAndTheFullSort) {
  SplitMix64 rng(printed_seed());
  for (const int n : {1, 7, 8, 9, 63, 511, 512, 513, 1000, 4099, 151936}) {
    std::vector<float> x(n);
    for (float& v : x) v = 4.0f * rng.normal();
    for (const int top : {0, 1, 5, 20}) expect_matches(x, top, "normal");
    // A few far below the maximum (their exp underflows) and ties at the top.
    if (n >= 9) {
      x[3] = -200.0f;
      x[n - 2] = x[n - 1] - 120.0f;
      const float hi = *std::max_element(x.begin(), x.end()) + 1.0f;
      x[n / 3] = hi;
      x[n / 5 + 1] = hi;
      x[n - 1] = hi;
      expect_matches(x, 5, "ties and underflow");
      x[2] = -kInf;
      expect_matches(x, 20, "-inf entry");
    }
  }
}

TEST(TokenLogprob, RisingRowsKeepReplacingTheTopList) {
  // Every value beats every earlier one: the top list changes at each element.
  for (const int n : {17, 1030}) {
    std::vector<float> x(n);
    for (int i = 0; i < n; ++i) x[i] = 0.01f * static_cast<float>(i);
    expect_matches(x, 20, "rising");
    std::reverse(x.begin(), x.end());
    expect_matches(x, 20, "falling");
  }
}

TEST(TokenLogprob, NanMakesEveryLogprobNanAndRanksLast) {
  std::vector<float> x = {1.0f, NAN, 3.0f, 2.0f, NAN, 0.5f, 3.0f, -1.0f, 2.5f};
  const TokenLogprob got = token_logprob(x, 0, 9);
  EXPECT_TRUE(std::isnan(got.logprob));
  ASSERT_EQ(got.top.size(), 9u);
  const std::vector<int32_t> want = {2, 6, 8, 3, 0, 5, 7, 1, 4};
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(got.top[k].token, want[k]) << "rank " << k;
    EXPECT_TRUE(std::isnan(got.top[k].logprob)) << "rank " << k;
  }
}

TEST(TokenLogprob, AllMinusInfinityAndOutOfRangeTokens) {
  const std::vector<float> x(10, -kInf);
  const TokenLogprob got = token_logprob(x, 4, 3);
  EXPECT_EQ(got.logprob, -kInf);
  ASSERT_EQ(got.top.size(), 3u);
  EXPECT_EQ(got.top[0].token, 0);
  EXPECT_EQ(got.top[2].token, 2);
  const std::vector<float> y = {0.0f, 1.0f};
  EXPECT_EQ(token_logprob(y, -1, 0).logprob, -kInf);
  EXPECT_EQ(token_logprob(y, 2, 0).logprob, -kInf);
  EXPECT_EQ(token_logprob(y, 1, 99).top.size(), 2u);
}

}  // namespace
}  // namespace megadecode
