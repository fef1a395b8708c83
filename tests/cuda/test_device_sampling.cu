// GPU tests of the device row sampler (cuda/common/sampling.cuh) at the megakernel's 256 threads
// and at 1024: greedy argmax (ties to the lowest id), reproducibility per (seed, position), kept
// sets of min-p / top-k / top-p equal to the host sampler's, and the empirical distribution.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "core/check.h"
#include "sampling/host_sampler.h"
#include "gpu_test_util.h"
#include "kernels/kernels.h"

namespace megadecode::cuda {
namespace {

using test::DeviceBuffer;

// The reference kept set: the host sampler's candidates (steps 3-6 of sampling/host_sampler.h).
std::set<int> kept_set(const float* l, int vocab, const DeviceSamplingParams& d) {
  SamplingParams p;
  p.temperature = d.temperature;
  p.top_k = d.top_k;
  p.top_p = d.top_p;
  p.min_p = d.min_p;
  std::set<int> ids;
  for (const sampling::Candidate& c : sampling::sampling_candidates(std::span<const float>(l, vocab), p, {}))
    ids.insert(c.id);
  return ids;
}

// The row sampler at the megakernel's 256 threads or at 1024 (kThreadCounts).
constexpr int kThreadCounts[] = {256, 1024};

std::vector<int32_t> sample(const std::vector<float>& logits, int vocab, const std::vector<DeviceSamplingParams>& params,
                            int threads) {
  const int rows = int(params.size());
  DeviceBuffer<float> dl(logits);
  DeviceBuffer<DeviceSamplingParams> dp(params);
  DeviceBuffer<int32_t> tok(rows);
  tok.fill_bytes(0xFF);
  sample_tokens(dl.get(), vocab, rows, vocab, dp.get(), tok.get(), threads, nullptr);
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
    for (int threads : kThreadCounts) {
      const auto got = sample(l, vocab, p, threads);
      for (int r = 0; r < rows; ++r) EXPECT_EQ(got[r], want[r]) << "vocab " << vocab << " row " << r << " " << threads;
    }
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
    const auto kept = kept_set(base.data(), vocab, s);
    const auto got = sample(l, vocab, p, 256);
    for (int r = 0; r < rows; ++r)
      ASSERT_TRUE(kept.count(got[r])) << "row " << r << " drew " << got[r] << " outside the kept set of " << kept.size();
    // Reproducible: same (seed, position) -> same token, whatever the row order or the CTA size.
    std::vector<DeviceSamplingParams> rev(p.rbegin(), p.rend());
    const auto again = sample(l, vocab, rev, 1024);
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
  const auto got = sample(l, vocab, p, 256);
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
    for (int threads : kThreadCounts) {
      const auto got = sample(l, vocab, p, threads);
      for (int r = 0; r < rows; ++r) {
        const auto kept = kept_set(&l[size_t(r) * vocab], vocab, p[r]);
        EXPECT_TRUE(kept.count(got[r])) << "row " << r << " token " << got[r] << " threads " << threads;
      }
    }
  }
}

TEST(Sampling, RejectsBadArguments) {
  EXPECT_THROW(sample_tokens(nullptr, 10, 1, 0, nullptr, nullptr, 256, nullptr), Error);
  EXPECT_THROW(sample_tokens(nullptr, 5, 1, 10, nullptr, nullptr, 256, nullptr), Error);
  EXPECT_THROW(sample_tokens(nullptr, 10, 1, 10, nullptr, nullptr, 512, nullptr), Error);
}

}  // namespace
}  // namespace megadecode::cuda
