// GPU tests of the device row sampler (cuda/common/sampling.cuh) at the megakernel's 256 threads
// and at 1024: greedy argmax (ties to the lowest id), reproducibility per (seed, position), kept
// sets of min-p / top-k / top-p equal to the host sampler's, the empirical distribution, and token
// masks (structured output): a masked row's token is the host sampler's under the same mask, in a
// batch with unmasked rows. The device logprobs (row_logprobs): engine/logits.h token_logprob's
// token and top-20 ids exactly, its values to 2e-5, on awkward vocabularies, tied values, -inf
// tokens, and rows with a NaN or nothing finite.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "core/check.h"
#include "engine/logits.h"
#include "sampling/host_sampler.h"
#include "sampling/token_mask.h"
#include "../gpu_test_util.h"
#include "cuda/common/kernels.h"

namespace megadecode::cuda {
namespace {

using test::DeviceBuffer;

// The reference kept set: the host sampler's candidates (steps 3-6 of sampling/host_sampler.h).
std::set<int> kept_set(const float* l, int vocab, const SamplingParams& p) {
  std::set<int> ids;
  for (const sampling::Candidate& c : sampling::sampling_candidates(std::span<const float>(l, vocab), p, {}))
    ids.insert(c.id);
  return ids;
}

// The row sampler at the megakernel's 256 threads or at 1024 (kThreadCounts).
constexpr int kThreadCounts[] = {256, 1024};

// Row r samples under params[r] at positions[r] (every row at position 0 when positions is empty).
std::vector<int32_t> sample(const std::vector<float>& logits, int vocab, const std::vector<SamplingParams>& params,
                            std::vector<int64_t> positions, int threads) {
  const int rows = int(params.size());
  positions.resize(rows, 0);
  DeviceBuffer<float> dl(logits);
  DeviceBuffer<SamplingParams> dp(params);
  DeviceBuffer<int64_t> dpos(positions);
  DeviceBuffer<int32_t> tok(rows);
  tok.fill_bytes(0xFF);
  sample_tokens(dl.get(), vocab, rows, vocab, dp.get(), dpos.get(), tok.get(), threads, nullptr);
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
    const std::vector<SamplingParams> p(rows, SamplingParams{.temperature = 0.0f, .seed = 1});
    for (int threads : kThreadCounts) {
      const auto got = sample(l, vocab, p, {}, threads);
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
  const SamplingParams settings[] = {{.temperature = 1.0f, .top_k = 5},
                                     {.temperature = 0.7f, .top_p = 0.6f},
                                     {.temperature = 1.3f, .min_p = 0.05f},
                                     {.temperature = 1.0f, .top_k = 40, .top_p = 0.9f, .min_p = 0.01f},
                                     {.temperature = 1.0f, .top_k = 1},
                                     {.temperature = 2.0f, .top_p = 1e-6f},
                                     {.temperature = 0.5f, .top_k = 2999, .top_p = 0.999f},
                                     {.temperature = 1.0f}};
  for (const auto& s : settings) {
    SCOPED_TRACE(::testing::Message() << "T=" << s.temperature << " k=" << s.top_k << " p=" << s.top_p << " min_p=" << s.min_p);
    const int rows = 400;  // one logits row, 400 positions
    std::vector<float> l(size_t(rows) * vocab);
    for (int r = 0; r < rows; ++r) std::copy(base.begin(), base.end(), l.begin() + size_t(r) * vocab);
    std::vector<SamplingParams> p(rows, s);
    std::vector<int64_t> pos(rows);
    for (int r = 0; r < rows; ++r) {
      p[r].seed = seed;
      pos[r] = 1000 + r;
    }
    const auto kept = kept_set(base.data(), vocab, s);
    const auto got = sample(l, vocab, p, pos, 256);
    for (int r = 0; r < rows; ++r)
      ASSERT_TRUE(kept.count(got[r])) << "row " << r << " drew " << got[r] << " outside the kept set of " << kept.size();
    // Reproducible: same (seed, position) -> same token, whatever the row order or the CTA size.
    const auto again = sample(l, vocab, std::vector<SamplingParams>(p.rbegin(), p.rend()),
                              std::vector<int64_t>(pos.rbegin(), pos.rend()), 1024);
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
  const std::vector<SamplingParams> p(rows, SamplingParams{.temperature = 0.8f, .seed = seed});
  std::vector<int64_t> pos(rows);
  std::iota(pos.begin(), pos.end(), 0);
  const auto got = sample(l, vocab, p, pos, 256);
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
    std::vector<SamplingParams> p(rows);
    for (int r = 0; r < rows; ++r)
      p[r] = SamplingParams{.temperature = 0.9f, .top_k = r % 2 ? 50 : 0, .top_p = r % 3 ? 0.9f : 1.0f,
                            .min_p = r % 4 ? 0.0f : 0.02f, .seed = seed + r};
    for (int threads : kThreadCounts) {
      const auto got = sample(l, vocab, p, std::vector<int64_t>(rows, 77), threads);
      for (int r = 0; r < rows; ++r) {
        const auto kept = kept_set(&l[size_t(r) * vocab], vocab, p[r]);
        EXPECT_TRUE(kept.count(got[r])) << "row " << r << " token " << got[r] << " threads " << threads;
      }
    }
  }
}

TEST(Sampling, TokenMasksGiveTheHostSamplersToken) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("Sampling.TokenMasks"));
  for (int vocab : {1, 33, 1003, 151936}) {
    const int rows = 7;
    const size_t words = token_mask_words(vocab);
    std::vector<float> l(size_t(rows) * vocab);
    for (auto& x : l) x = rng.normal() * 3.0f;
    std::vector<SamplingParams> p(rows);
    std::vector<int64_t> pos(rows);
    std::vector<int32_t> slots(rows, -1);
    std::vector<uint32_t> masks;
    for (int r = 0; r < rows; ++r) {
      p[r] = SamplingParams{.temperature = r % 3 == 0 ? 0.0f : 0.9f, .seed = rng.next()};
      if (r == 2) p[r].top_k = 5;
      if (r == 4) p[r].top_p = 0.8f;
      if (r == 5) p[r].min_p = 0.05f;
      pos[r] = int64_t(rng.below(100000));
      if (r == 6) continue;  // unmasked
      slots[r] = int32_t(masks.size() / words);
      const float density = r == 1 ? 0.0f : rng.unit();
      for (size_t w = 0; w < words; ++w) {
        uint32_t m = 0;
        for (int bit = 0; bit < 32; ++bit) m |= rng.unit() < density ? 1u << bit : 0u;
        masks.push_back(m);
      }
      const int one = int(rng.below(vocab));
      masks[size_t(slots[r]) * words + one / 32] |= 1u << (one % 32);
    }
    DeviceBuffer<float> dl(l);
    DeviceBuffer<SamplingParams> dp(p);
    DeviceBuffer<int64_t> dpos(pos);
    DeviceBuffer<int32_t> dslots(slots);
    DeviceBuffer<uint32_t> dmasks(masks);
    for (int threads : kThreadCounts) {
      DeviceBuffer<int32_t> tok(rows);
      tok.fill_bytes(0xFF);
      sample_tokens(dl.get(), vocab, rows, vocab, dp.get(), dpos.get(), tok.get(), threads, nullptr, dslots.get(),
                    dmasks.get());
      const std::vector<int32_t> got = tok.download();
      for (int r = 0; r < rows; ++r) {
        const std::span<const float> row(&l[size_t(r) * vocab], vocab);
        std::span<const uint32_t> mask;
        if (slots[r] >= 0) mask = std::span<const uint32_t>(masks).subspan(size_t(slots[r]) * words, words);
        EXPECT_EQ(got[r], sampling::sample_token(row, p[r], pos[r], {}, mask))
            << "vocab " << vocab << " row " << r << " threads " << threads;
        if (!mask.empty()) EXPECT_TRUE(token_mask_allows(mask.data(), got[r]));
      }
    }
  }
}

TEST(Sampling, RowLogprobsAreTheHostsTokenLogprob) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("Sampling.RowLogprobs"));
  for (int vocab : {1, 7, 19, 20, 21, 333, 5000, 151936}) {
    const int rows = 6;
    std::vector<float> l(size_t(rows) * vocab);
    std::vector<int32_t> tokens(rows);
    for (int r = 0; r < rows; ++r) {
      float* row = &l[size_t(r) * vocab];
      for (int i = 0; i < vocab; ++i) {
        row[i] = rng.normal() * 4.0f;
        if (r == 1) row[i] = std::round(row[i]);                            // many tied values
        if (r == 2 && rng.below(3) == 0) row[i] = -INFINITY;                 // banned tokens
        if (r == 5) row[i] = -INFINITY;                                     // nothing finite
      }
      if (r == 3) row[rng.below(vocab)] = NAN;                              // a NaN row
      if (r == 4) row[rng.below(vocab)] = 80.0f, row[rng.below(vocab)] = 80.0f;  // a tie at the top
      tokens[r] = static_cast<int32_t>(rng.below(vocab));
    }
    DeviceBuffer<float> dl(l);
    DeviceBuffer<int32_t> dt(tokens);
    DeviceBuffer<RowLogprobs> out(rows);
    out.poison();
    row_logprobs(dl.get(), vocab, rows, vocab, dt.get(), out.get(), nullptr);
    const std::vector<RowLogprobs> got = out.download();
    auto same = [](float a, float b) {
      return (std::isnan(a) && std::isnan(b)) || a == b || std::fabs(a - b) <= 2e-5f;
    };
    for (int r = 0; r < rows; ++r) {
      const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(r);
      const TokenLogprob want =
          token_logprob(std::span<const float>(&l[size_t(r) * vocab], vocab), tokens[r], kMaxTopLogprobs);
      EXPECT_EQ(got[r].token, tokens[r]) << what;
      EXPECT_TRUE(same(got[r].logprob, want.logprob)) << what << ": " << got[r].logprob << " vs " << want.logprob;
      for (int k = 0; k < kMaxTopLogprobs; ++k) {
        if (k >= static_cast<int>(want.top.size())) {  // vocab < 20: past the vocabulary
          EXPECT_EQ(got[r].ids[k], -1) << what << " top " << k;
          continue;
        }
        EXPECT_EQ(got[r].ids[k], want.top[k].token) << what << " top " << k;
        EXPECT_TRUE(same(got[r].logprobs[k], want.top[k].logprob))
            << what << " top " << k << ": " << got[r].logprobs[k] << " vs " << want.top[k].logprob;
      }
    }
  }
}

TEST(Sampling, RejectsBadArguments) {
  EXPECT_THROW(sample_tokens(nullptr, 10, 1, 0, nullptr, nullptr, nullptr, 256, nullptr), Error);
  EXPECT_THROW(sample_tokens(nullptr, 5, 1, 10, nullptr, nullptr, nullptr, 256, nullptr), Error);
  EXPECT_THROW(sample_tokens(nullptr, 10, 1, 10, nullptr, nullptr, nullptr, 512, nullptr), Error);
}

}  // namespace
}  // namespace megadecode::cuda
