// Token masks (sampling/token_mask.h) in the host sampler: under every sampling mode, random masks
// and awkward vocabulary sizes, no disallowed token is ever sampled or kept as a candidate; the
// masked draw equals the unmasked draw over logits with the disallowed ones set to -inf; a mask
// that allows everything gives exactly the unconstrained token; bad masks are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/rng.h"
#include "sampling/host_sampler.h"
#include "sampling/token_mask.h"

namespace megadecode::sampling {
namespace {

uint64_t print_seed() {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

// The sampling modes: greedy, temperature, top-k, top-p, min-p, all filters, penalties.
std::vector<SamplingParams> modes(SplitMix64& rng) {
  std::vector<SamplingParams> out;
  auto with = [&](float t, int k, float p, float m) {
    SamplingParams s;
    s.temperature = t;
    s.top_k = k;
    s.top_p = p;
    s.min_p = m;
    s.seed = rng.next();
    out.push_back(s);
  };
  with(0.0f, 0, 1.0f, 0.0f);
  with(0.7f, 0, 1.0f, 0.0f);
  with(1.3f, 1 + static_cast<int>(rng.below(40)), 1.0f, 0.0f);
  with(1.0f, 0, 0.2f + static_cast<float>(rng.below(70)) / 100.0f, 0.0f);
  with(1.0f, 0, 1.0f, static_cast<float>(rng.below(50)) / 100.0f);
  with(0.9f, 5, 0.8f, 0.05f);
  SamplingParams pen = out[static_cast<size_t>(rng.below(out.size()))];
  pen.repetition_penalty = 1.3f;
  pen.presence_penalty = 0.5f;
  pen.frequency_penalty = 0.4f;
  out.push_back(pen);
  return out;
}

// A random mask of `vocab` tokens: a share `density` allowed (at least one), stray bits past the
// vocabulary set (they must not matter).
std::vector<uint32_t> random_mask(SplitMix64& rng, int vocab, double density) {
  std::vector<uint32_t> m(token_mask_words(vocab), 0u);
  for (int t = 0; t < vocab; ++t)
    if (rng.unit() < density) m[t >> 5] |= 1u << (t & 31);
  const int one = static_cast<int>(rng.below(vocab));
  m[one >> 5] |= 1u << (one & 31);
  if (vocab % 32 != 0) m.back() |= ~((1u << (vocab % 32)) - 1u);
  return m;
}

TEST(TokenMask, NoModeEverPicksADisallowedToken) {
  SplitMix64 rng(print_seed());
  for (int vocab : {1, 2, 31, 32, 33, 257, 1003, 4099}) {
    for (int trial = 0; trial < 12; ++trial) {
      std::vector<float> l(vocab);
      for (float& x : l) x = 3.0f * rng.normal();
      if (trial % 3 == 0)  // the best tokens disallowed, often: the mask must bite
        for (float& x : l) x = std::round(x);
      const double density = trial % 4 == 0 ? 0.0 : rng.unit();
      const std::vector<uint32_t> mask = random_mask(rng, vocab, density);
      std::vector<int32_t> prompt, output;
      for (int i = 0; i < 8; ++i) output.push_back(static_cast<int32_t>(rng.below(vocab)));
      const TokenHistory h{prompt, output};
      std::vector<float> minus_inf = l;  // the same row with the disallowed logits at -inf by hand
      for (int t = 0; t < vocab; ++t)
        if (!token_mask_allows(mask.data(), t)) minus_inf[t] = -std::numeric_limits<float>::infinity();
      for (const SamplingParams& p : modes(rng)) {
        const std::string what = "vocab " + std::to_string(vocab) + " trial " + std::to_string(trial) + " T " +
                                 std::to_string(p.temperature) + " k " + std::to_string(p.top_k) + " p " +
                                 std::to_string(p.top_p) + " min_p " + std::to_string(p.min_p);
        for (const Candidate& c : sampling_candidates(l, p, h, mask))
          ASSERT_TRUE(token_mask_allows(mask.data(), c.id)) << what << ": candidate " << c.id;
        for (int draw = 0; draw < 8; ++draw) {
          const int64_t position = static_cast<int64_t>(rng.below(1 << 20));
          const int32_t t = sample_token(l, p, position, h, mask);
          ASSERT_TRUE(t >= 0 && t < vocab && token_mask_allows(mask.data(), t)) << what << ": token " << t;
          EXPECT_EQ(t, sample_token(minus_inf, p, position, h)) << what;
        }
      }
    }
  }
}

TEST(TokenMask, AMaskThatAllowsEverythingChangesNothing) {
  SplitMix64 rng(print_seed());
  for (int vocab : {1, 33, 1003, 5000}) {
    std::vector<float> l(vocab);
    for (float& x : l) x = 2.0f * rng.normal();
    const std::vector<uint32_t> all(token_mask_words(vocab), ~0u);
    const std::vector<int32_t> prompt = {0}, output = {static_cast<int32_t>(vocab - 1)};
    const TokenHistory h{prompt, output};
    for (const SamplingParams& p : modes(rng)) {
      for (int draw = 0; draw < 20; ++draw) {
        const int64_t position = static_cast<int64_t>(rng.below(1 << 20));
        EXPECT_EQ(sample_token(l, p, position, h, all), sample_token(l, p, position, h)) << "vocab " << vocab;
      }
      const std::vector<Candidate> a = sampling_candidates(l, p, h, all), b = sampling_candidates(l, p, h);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].id, b[i].id);
        EXPECT_EQ(a[i].prob, b[i].prob);
      }
    }
  }
}

TEST(TokenMask, DisallowedNaNLogitsDoNotMatter) {
  std::vector<float> l = {NAN, 1.0f, 2.0f, NAN};
  const std::vector<uint32_t> mask = {0b0110u};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(sample_token(l, greedy, 0, {}, mask), 2);
  SamplingParams hot;
  hot.temperature = 5.0f;
  for (int64_t pos = 0; pos < 50; ++pos) {
    const int32_t t = sample_token(l, hot, pos, {}, mask);
    EXPECT_TRUE(t == 1 || t == 2);
  }
}

TEST(TokenMask, BadMasksAreErrors) {
  const std::vector<float> l(40, 0.0f);
  SamplingParams p;
  const std::vector<uint32_t> short_mask = {~0u};
  EXPECT_THROW(sample_token(l, p, 0, {}, short_mask), Error);
  const std::vector<uint32_t> none = {0u, 0u};
  EXPECT_THROW(sample_token(l, p, 0, {}, none), Error);
  const std::vector<uint32_t> past_vocab = {0u, 0xffffff00u};  // only tokens 40.. set
  EXPECT_THROW(check_token_mask(past_vocab, l.size()), Error);
  const std::vector<uint32_t> last = {0u, 0x80u};  // token 39
  EXPECT_NO_THROW(check_token_mask(last, l.size()));
  EXPECT_EQ(sample_token(l, p, 0, {}, last), 39);
  EXPECT_TRUE(mask_allows({}, 12345));
}

}  // namespace
}  // namespace megadecode::sampling
