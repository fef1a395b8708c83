// GPU tests of the device sampler: greedy argmax (ties to the lowest id), reproducibility per
// (seed, position), kept sets of min-p / top-k / top-p equal to the reference rules, and the
// empirical distribution of the draw.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "core/check.h"
#include "gpu_test_util.h"
#include "kernels/kernels.h"

namespace megadecode::cuda {
namespace {

using test::DeviceBuffer;

// The reference kept set (host sampler's rules, sampling/host_sampler.h steps 3-6), as token ids.
std::set<int> kept_set(const float* l, int vocab, const DeviceSamplingParams& p) {
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  std::vector<double> prob(vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += (prob[i] = std::exp((double(l[i]) - l[order[0]]) / p.temperature));
  for (auto& x : prob) x /= sum;
  size_t n = vocab;
  if (p.min_p > 0) {
    n = 0;
    while (n < size_t(vocab) && prob[order[n]] >= p.min_p * prob[order[0]]) ++n;
  }
  if (p.top_k > 0) n = std::min<size_t>(n, p.top_k);
  if (p.top_p < 1) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += prob[order[i]];
    double before = 0;
    size_t m = 0;
    while (m < n && before < p.top_p * total) before += prob[order[m++]];
    n = std::max<size_t>(m, 1);
  }
  return std::set<int>(order.begin(), order.begin() + n);
}

std::vector<int32_t> sample(const std::vector<float>& logits, int vocab, const std::vector<DeviceSamplingParams>& params) {
  const int rows = int(params.size());
  DeviceBuffer<float> dl(logits);
  DeviceBuffer<DeviceSamplingParams> dp(params);
  DeviceBuffer<int32_t> tok(rows);
  DeviceBuffer<uint8_t> ws(sampling_workspace_bytes(rows, vocab));
  tok.fill_bytes(0xFF);
  sample_tokens(dl.get(), vocab, rows, vocab, dp.get(), tok.get(), ws.get(), nullptr);
  return tok.download();
}

TEST(Sampling, GreedyIsArgmaxWithTiesToLowestId) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("Sampling.Greedy"));
  for (int vocab : {1, 7, 5000, 151936}) {
    const int rows = 3;
    std::vector<float> l(size_t(rows) * vocab);
    for (auto& x : l) x = rng.normal() * 3.0f;
    std::vector<int> want(rows);
    for (int r = 0; r < rows; ++r) {
      float* row = &l[size_t(r) * vocab];
      const int a = int(rng.below(vocab)), b = int(rng.below(vocab));
      row[a] = row[b] = 100.0f;  // a tie at the top
      want[r] = std::min(a, b);
    }
    std::vector<DeviceSamplingParams> p(rows, DeviceSamplingParams{0.0f, 0, 1.0f, 0.0f, 1, 0});
    const auto got = sample(l, vocab, p);
    for (int r = 0; r < rows; ++r) EXPECT_EQ(got[r], want[r]) << "vocab " << vocab << " row " << r;
  }
}

TEST(Sampling, FiltersKeepTheReferenceSetAndDrawsAreReproducible) {
  MD_REQUIRE_GPU();
  const uint64_t seed = test::seed_for("Sampling.Filters");
  SplitMix64 rng(seed);
  const int vocab = 3000;
  std::vector<float> base(vocab);
  for (auto& x : base) x = rng.normal() * 2.0f;
  base[17] = base[18];  // a tie inside the kept region
  const DeviceSamplingParams settings[] = {
      {1.0f, 5, 1.0f, 0.0f, 0, 0},     {0.7f, 0, 0.6f, 0.0f, 0, 0},   {1.3f, 0, 1.0f, 0.05f, 0, 0},
      {1.0f, 40, 0.9f, 0.01f, 0, 0},   {1.0f, 1, 1.0f, 0.0f, 0, 0},   {2.0f, 0, 1e-6f, 0.0f, 0, 0},
      {0.5f, 2999, 0.999f, 0.0f, 0, 0}, {1.0f, 0, 1.0f, 0.0f, 0, 0}};
  for (const auto& s : settings) {
    SCOPED_TRACE(::testing::Message() << "T=" << s.temperature << " k=" << s.top_k << " p=" << s.top_p << " min_p=" << s.min_p);
    const int rows = 400;  // one logits row, 400 positions
    std::vector<float> l(size_t(rows) * vocab);
    for (int r = 0; r < rows; ++r) std::copy(base.begin(), base.end(), l.begin() + size_t(r) * vocab);
    std::vector<DeviceSamplingParams> p(rows, s);
    for (int r = 0; r < rows; ++r) {
      p[r].seed = seed;
      p[r].position = 1000 + r;
    }
    const auto got = sample(l, vocab, p);
    const auto kept = kept_set(base.data(), vocab, s);
    for (int r = 0; r < rows; ++r) ASSERT_TRUE(kept.count(got[r])) << "row " << r << " drew " << got[r] << " outside the kept set of " << kept.size();
    // Reproducible: same (seed, position) -> same token, whatever the row order.
    std::vector<DeviceSamplingParams> rev(p.rbegin(), p.rend());
    const auto again = sample(l, vocab, rev);
    for (int r = 0; r < rows; ++r) ASSERT_EQ(again[rows - 1 - r], got[r]);
  }
}

TEST(Sampling, EmpiricalDistributionMatchesSoftmax) {
  MD_REQUIRE_GPU();
  const uint64_t seed = test::seed_for("Sampling.Distribution");
  const int vocab = 6, rows = 20000;
  const std::vector<float> base = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 1.0f};
  std::vector<float> l(size_t(rows) * vocab);
  for (int r = 0; r < rows; ++r) std::copy(base.begin(), base.end(), l.begin() + size_t(r) * vocab);
  std::vector<DeviceSamplingParams> p(rows, DeviceSamplingParams{0.8f, 0, 1.0f, 0.0f, seed, 0});
  for (int r = 0; r < rows; ++r) p[r].position = r;
  const auto got = sample(l, vocab, p);
  std::vector<double> prob(vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += (prob[i] = std::exp(base[i] / 0.8));
  std::vector<int> count(vocab, 0);
  for (int t : got) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, vocab);
    ++count[t];
  }
  for (int i = 0; i < vocab; ++i) {
    const double expect = rows * prob[i] / sum;
    EXPECT_NEAR(count[i], expect, 5 * std::sqrt(expect) + 1) << "token " << i;  // 5 sigma
  }
}

TEST(Sampling, FullVocabularyBatch) {
  MD_REQUIRE_GPU();
  const uint64_t seed = test::seed_for("Sampling.FullVocabularyBatch");
  SplitMix64 rng(seed);
  const int vocab = 151936;
  for (int rows : {1, 3, 17}) {
    std::vector<float> l(size_t(rows) * vocab);
    for (auto& x : l) x = rng.normal() * 4.0f;
    std::vector<DeviceSamplingParams> p(rows);
    for (int r = 0; r < rows; ++r) p[r] = DeviceSamplingParams{0.9f, r % 2 ? 50 : 0, r % 3 ? 0.9f : 1.0f, r % 4 ? 0.0f : 0.02f, seed + r, 77};
    const auto got = sample(l, vocab, p);
    for (int r = 0; r < rows; ++r) {
      const auto kept = kept_set(&l[size_t(r) * vocab], vocab, p[r]);
      EXPECT_TRUE(kept.count(got[r])) << "row " << r << " token " << got[r];
    }
  }
}

TEST(Sampling, RejectsBadArguments) {
  EXPECT_THROW(sample_tokens(nullptr, 10, 1, 0, nullptr, nullptr, nullptr, nullptr), Error);
  EXPECT_THROW(sample_tokens(nullptr, 5, 1, 10, nullptr, nullptr, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace megadecode::cuda
