// Tests of the host sampler: greedy ties, penalties (vLLM semantics), the kept sets of min-p /
// top-k / top-p, determinism per (seed, position), the Gumbel-max draw, and chi-square tests that
// the empirical distribution over many seeds matches an independently computed filtered one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "core/check.h"
#include "core/rng.h"
#include "sampling/host_sampler.h"

namespace megadecode::sampling {
namespace {

uint64_t print_seed() {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

SamplingParams params(float temperature, int top_k = 0, float top_p = 1.0f, float min_p = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

std::vector<int32_t> candidate_ids(std::span<const float> logits, const SamplingParams& p) {
  std::vector<int32_t> ids;
  for (const Candidate& c : sampling_candidates(logits, p, {})) ids.push_back(c.id);
  return ids;
}

// The distribution the sampler should draw from, computed independently in double.
std::vector<double> expected_distribution(const std::vector<float>& logits, const SamplingParams& p) {
  const size_t n = logits.size();
  std::vector<double> prob(n);
  const double m = *std::max_element(logits.begin(), logits.end()) / static_cast<double>(p.temperature);
  double z = 0;
  for (size_t i = 0; i < n; ++i) z += prob[i] = std::exp(logits[i] / static_cast<double>(p.temperature) - m);
  for (double& q : prob) q /= z;
  const double max_p = *std::max_element(prob.begin(), prob.end());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
  std::vector<int> kept;
  for (int i : order) {
    if (prob[i] >= p.min_p * max_p) kept.push_back(i);
  }
  if (p.top_k > 0 && kept.size() > static_cast<size_t>(p.top_k)) kept.resize(p.top_k);
  double total = 0;
  for (int i : kept) total += prob[i];
  std::vector<double> out(n, 0.0);
  double before = 0;
  for (int i : kept) {
    if (before >= p.top_p) break;
    out[i] = prob[i] / total;
    before += out[i];
  }
  const double s = std::accumulate(out.begin(), out.end(), 0.0);
  for (double& q : out) q /= s;
  return out;
}

// Pearson chi-square of counts against expected probabilities (bins with expectation < 5 merged).
// Returns (statistic, degrees of freedom); a count in a zero-probability bin gives +inf.
std::pair<double, int> chi_square(const std::vector<int>& counts, const std::vector<double>& expected, int n) {
  double stat = 0, small_exp = 0, small_obs = 0;
  int bins = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = expected[i] * n;
    if (expected[i] == 0.0) {
      if (counts[i] > 0) return {INFINITY, 1};
      continue;
    }
    if (e < 5) {
      small_exp += e;
      small_obs += counts[i];
      continue;
    }
    stat += (counts[i] - e) * (counts[i] - e) / e;
    ++bins;
  }
  if (small_exp > 0) {
    stat += (small_obs - small_exp) * (small_obs - small_exp) / small_exp;
    ++bins;
  }
  return {stat, std::max(1, bins - 1)};
}

// Upper critical value at p = 1e-6 (Wilson-Hilferty; z = 4.753).
double chi_square_critical(int df) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + 4.753 * std::sqrt(a), 3.0);
}

const std::vector<float> kLogits = {2.0f, 1.5f, 1.2f, 1.0f, 0.3f, 0.0f, -0.5f, -1.0f, -2.0f, -3.0f, 0.9f, 1.4f};

TEST(Sampling, GreedyTakesTheLowestIdAmongTies) {
  const std::vector<float> l = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  EXPECT_EQ(sample_token(l, params(0.0f), 7, {}), 1);
  EXPECT_EQ(sample_token(l, params(1e-6f), 7, {}), 1);  // below kGreedyTemperature
  const std::vector<float> neg = {-INFINITY, -5.0f, -5.0f};
  EXPECT_EQ(sample_token(neg, params(0.0f), 0, {}), 1);
}

TEST(Sampling, PenaltiesFollowVllm) {
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.1f;
  p.presence_penalty = 0.3f;
  const std::vector<int32_t> prompt = {0}, output = {1, 2, 2};
  apply_penalties(l, p, TokenHistory{prompt, output});
  EXPECT_FLOAT_EQ(l[0], 1.0f);                // prompt token: repetition only (positive: divided)
  EXPECT_FLOAT_EQ(l[1], -4.0f - 0.1f - 0.3f);  // negative: multiplied; once in output
  EXPECT_FLOAT_EQ(l[2], 0.5f - 0.2f - 0.3f);   // twice in output
  EXPECT_FLOAT_EQ(l[3], 0.5f);                 // unseen
  const std::vector<int32_t> bad = {4};
  EXPECT_THROW(apply_penalties(l, p, TokenHistory{{}, bad}), Error);
}

TEST(Sampling, FiltersKeepTheDocumentedSets) {
  // probabilities at T=1 are proportional to exp(logit); order by logit: 0, 1, 11, 2, 3, 10, 4, 5, ...
  EXPECT_EQ(candidate_ids(kLogits, params(1.0f, 3)), (std::vector<int32_t>{0, 1, 11}));
  // min-p 0.5: keep exp(l - 2) >= 0.5, i.e. l >= 2 - ln 2 = 1.307.
  EXPECT_EQ(candidate_ids(kLogits, params(1.0f, 0, 1.0f, 0.5f)), (std::vector<int32_t>{0, 1, 11}));
  // top-p: the mass of the kept prefix must reach p; the prefix before the last kept token must not.
  for (float top_p : {0.05f, 0.3f, 0.5f, 0.8f, 0.95f}) {
    const std::vector<int32_t> ids = candidate_ids(kLogits, params(1.0f, 0, top_p));
    const std::vector<double> want = expected_distribution(kLogits, params(1.0f, 0, top_p));
    size_t n_want = 0;
    for (double q : want) n_want += q > 0;
    EXPECT_EQ(ids.size(), n_want) << "top_p " << top_p;
  }
  EXPECT_EQ(candidate_ids(kLogits, params(1.0f, 0, 0.01f)), (std::vector<int32_t>{0}));
  // top-p sees the probabilities renormalised after top-k: top-3 is {0: .464, 1: .281, 11: .255}.
  EXPECT_EQ(candidate_ids(kLogits, params(1.0f, 3, 0.7f)), (std::vector<int32_t>{0, 1}));
  // Ties (the one tie rule, sampling/params.h): top-k keeps exactly k tokens, lower ids first;
  // top-p cuts the tied run in id order.
  const std::vector<float> ties = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f};
  EXPECT_EQ(candidate_ids(ties, params(1.0f, 2)), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(candidate_ids(ties, params(1.0f, 0, 1e-6f)), (std::vector<int32_t>{1}));
  EXPECT_EQ(candidate_ids(ties, params(1.0f, 1)), (std::vector<int32_t>{1}));
}

TEST(Sampling, SameSeedAndPositionGiveTheSameToken) {
  SplitMix64 rng(print_seed());
  // Flat logits: the kept set (top-50, top-p 0.9) has dozens of comparable tokens, so 200 draws
  // hit fewer than 6 distinct ones only if the draws do not vary.
  std::vector<float> l(1000);
  for (float& x : l) x = 0.3f * rng.normal();
  const SamplingParams p = [&] {
    SamplingParams s = params(0.8f, 50, 0.9f);
    s.seed = rng.next();
    return s;
  }();
  std::map<int32_t, int> distinct;
  for (int64_t pos = 0; pos < 200; ++pos) {
    const int32_t a = sample_token(l, p, pos, {});
    EXPECT_EQ(a, sample_token(l, p, pos, {})) << "position " << pos;
    ++distinct[a];
  }
  EXPECT_GT(distinct.size(), 5u) << "different positions draw different numbers";
  EXPECT_NE(sampling_gumbel(1, 5, 0), sampling_gumbel(2, 5, 0));
  EXPECT_NE(sampling_gumbel(1, 5, 0), sampling_gumbel(1, 6, 0));
  EXPECT_NE(sampling_gumbel(1, 5, 0), sampling_gumbel(1, 5 + (int64_t{1} << 32), 0));
  EXPECT_NE(sampling_gumbel(1, 5, 0), sampling_gumbel(1, 5, 1));
  EXPECT_NE(sampling_gumbel(1ull << 32, 5, 0), sampling_gumbel(0, 5, 0));
}

// The draw is the documented Gumbel-max over the kept tokens (the device sampler's definition).
TEST(Sampling, DrawIsGumbelMaxWithTheDocumentedNoise) {
  SplitMix64 rng(print_seed());
  std::vector<float> l(300);
  for (float& x : l) x = rng.normal();
  for (int trial = 0; trial < 50; ++trial) {
    SamplingParams p = params(0.5f + rng.unit(), static_cast<int>(rng.below(40)), 0.5f + 0.5f * rng.unit());
    p.seed = rng.next();
    const int64_t position = static_cast<int64_t>(rng.next() >> 20);
    int32_t want = -1;
    float best = -INFINITY;
    for (const Candidate& c : sampling_candidates(l, p, {})) {
      const uint64_t pos = static_cast<uint64_t>(position);
      const Philox4 r = philox4x32(static_cast<uint32_t>(c.id), static_cast<uint32_t>(pos),
                                   static_cast<uint32_t>(pos >> 32), 0, static_cast<uint32_t>(p.seed),
                                   static_cast<uint32_t>(p.seed >> 32));
      const float u = (static_cast<float>(r.v[0] >> 8) + 0.5f) / 16777216.0f;
      const float score = l[c.id] * (1.0f / p.temperature) + -std::log(-std::log(u));
      if (want < 0 || score > best || (score == best && c.id < want)) {
        want = c.id;
        best = score;
      }
    }
    EXPECT_EQ(sample_token(l, p, position, {}), want) << "trial " << trial;
  }
}

TEST(Sampling, EmpiricalDistributionsMatch) {
  const uint64_t base = print_seed();
  const std::vector<SamplingParams> cases = {params(1.0f),         params(0.7f),          params(1.5f, 4),
                                             params(1.0f, 0, 0.8f), params(1.0f, 0, 1.0f, 0.2f),
                                             params(1.3f, 6, 0.9f, 0.05f), params(1.0f, 3, 0.7f)};
  const int n = 20000;
  for (const SamplingParams& p : cases) {
    SCOPED_TRACE(cat("T ", p.temperature, " top_k ", p.top_k, " top_p ", p.top_p, " min_p ", p.min_p));
    std::vector<int> counts(kLogits.size(), 0);
    for (int i = 0; i < n; ++i) {
      SamplingParams s = p;
      s.seed = base + static_cast<uint64_t>(i);
      ++counts[sample_token(kLogits, s, 1234, {})];
    }
    const std::vector<double> want = expected_distribution(kLogits, p);
    for (size_t t = 0; t < want.size(); ++t) {
      if (want[t] == 0.0) {
        EXPECT_EQ(counts[t], 0) << "excluded token " << t << " was sampled";
      }
    }
    const auto [stat, df] = chi_square(counts, want, n);
    EXPECT_LT(stat, chi_square_critical(df)) << "df " << df;
    std::printf("chi-square %.1f (df %d, critical %.1f)\n", stat, df, chi_square_critical(df));
    // The same counts clearly reject a wrong distribution: here, the unfiltered softmax at T = 1.
    const std::vector<double> wrong = expected_distribution(kLogits, params(1.0f));
    if (p.temperature != 1.0f || p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f) {
      const auto [wrong_stat, wrong_df] = chi_square(counts, wrong, n);
      EXPECT_GT(wrong_stat, 3 * chi_square_critical(wrong_df));
    }
  }
}

TEST(Sampling, LargeVocabularyNeverEmitsExcludedTokens) {
  SplitMix64 rng(print_seed());
  std::vector<float> l(5000);
  for (float& x : l) x = 3.0f * rng.normal();
  for (const SamplingParams& p : {params(1.0f, 10), params(1.0f, 0, 0.5f), params(1.0f, 0, 1.0f, 0.3f)}) {
    const std::vector<Candidate> kept = sampling_candidates(l, p, {});
    std::vector<bool> allowed(l.size(), false);
    for (const Candidate& c : kept) allowed[c.id] = true;
    for (int i = 0; i < 500; ++i) {
      SamplingParams s = p;
      s.seed = rng.next();
      const int32_t t = sample_token(l, s, static_cast<int64_t>(rng.below(100000)), {});
      EXPECT_TRUE(allowed[t]) << "token " << t;
    }
  }
}

TEST(Sampling, BadParametersAndLogitsAreErrors) {
  const std::vector<float> l = {0.0f, 1.0f};
  auto message = [&](const SamplingParams& p, std::span<const float> logits) -> std::string {
    try {
      sample_token(logits, p, 0, {});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(params(-1.0f), l).find("temperature"), std::string::npos);
  EXPECT_NE(message(params(1.0f, -2), l).find("top_k"), std::string::npos);
  EXPECT_NE(message(params(1.0f, 0, 0.0f), l).find("top_p"), std::string::npos);
  EXPECT_NE(message(params(1.0f, 0, 1.0f, 1.5f), l).find("min_p"), std::string::npos);
  SamplingParams rep = params(1.0f);
  rep.repetition_penalty = 0.0f;
  EXPECT_NE(message(rep, l).find("repetition_penalty"), std::string::npos);
  const std::vector<float> nan = {0.0f, NAN};
  EXPECT_NE(message(params(1.0f), nan).find("NaN"), std::string::npos);
  const std::vector<float> all_masked = {-INFINITY, -INFINITY};
  EXPECT_NE(message(params(1.0f), all_masked).find("-inf"), std::string::npos);
  EXPECT_NE(message(params(1.0f), {}).find("empty"), std::string::npos);
}

}  // namespace
}  // namespace megadecode::sampling
