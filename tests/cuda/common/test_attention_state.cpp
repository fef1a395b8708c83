// Host tests of the attention state (cuda/common/attention_state.cuh), the arithmetic every
// attention kernel shares: the online-softmax step over tiles (scale and mask, exponentials, the
// (m, l) update) equals the softmax computed at once (in double), a row spread over the four lanes
// of an MMA quad's accumulator fragments steps like the same row held by one thread, a log-sum-exp
// merge of split partials equals the unsplit state, empty tiles and empty partials contribute
// nothing and never make a NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/bf16.h"
#include "core/rng.h"
#include "cuda/common/attention_state.cuh"

namespace megadecode::cuda {
namespace {

constexpr float kScale = 0.0883883476f;  // 1/sqrt(128)

// A row's state (m, l, o) over raw scores q.k [begin, end) (keep: not masked) and one value per
// key, tile by tile as the kernels run it: scale and mask, the step of (m, l), o = o * alpha + P v.
AttnPartial online(const std::vector<float>& raw, const std::vector<char>& keep, const std::vector<float>& v,
                   int begin, int end, int tile) {
  float m = -INFINITY, l = 0.0f, o = 0.0f;
  std::vector<float> s;
  for (int t0 = begin; t0 < end; t0 += tile) {
    s.assign(raw.begin() + t0, raw.begin() + std::min(end, t0 + tile));
    const int n = static_cast<int>(s.size());
    auto score = [&](int i) -> float& { return s[i]; };
    const float tile_max = attn_scale_mask(n, score, attn_scale_log2(kScale), [&](int i) { return keep[t0 + i] != 0; });
    const float alpha = attn_online_step(m, l, tile_max, n, score, AttnIdentity{}, AttnIdentity{});
    float pv = 0.0f;
    for (int i = 0; i < n; ++i) pv += s[i] * v[t0 + i];
    o = o * alpha + pv;
  }
  return {m, l, o};
}

// sum_j softmax(kScale * raw)_j v_j over the kept keys, in double.
double exact(const std::vector<float>& raw, const std::vector<char>& keep, const std::vector<float>& v) {
  double mx = -INFINITY;
  for (size_t j = 0; j < raw.size(); ++j)
    if (keep[j]) mx = std::max(mx, static_cast<double>(raw[j]) * kScale);
  double num = 0, den = 0;
  for (size_t j = 0; j < raw.size(); ++j) {
    if (!keep[j]) continue;
    const double p = std::exp(raw[j] * static_cast<double>(kScale) - mx);
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
    std::vector<float> raw(n), v(n);
    std::vector<char> keep(n);
    for (int j = 0; j < n; ++j) {
      raw[j] = static_cast<float>(rng.normal() * 50.0);
      keep[j] = rng.below(8) != 0;  // masked keys too
      v[j] = static_cast<float>(rng.normal());
    }
    keep[rng.below(n)] = 1;  // at least one key
    const double want = exact(raw, keep, v);
    const int tile = 1 + static_cast<int>(rng.below(300));
    const AttnPartial whole = online(raw, keep, v, 0, n, tile);
    EXPECT_NEAR(attn_normalise(whole.o, whole.l), want, 1e-5 * (1 + std::fabs(want))) << "n " << n << " tile " << tile;
    // Split into ragged partials (some possibly empty), merged in split order.
    std::vector<AttnPartial> parts;
    for (int b = 0; b < n;) {
      const int e = std::min(n, b + static_cast<int>(rng.below(n + 1)));
      parts.push_back(online(raw, keep, v, b, e, tile));
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

// Tiles of 8 kN keys for the rows g and g + 8 of one quad (lanes t = 0..3) in m16n8k16 accumulator
// fragments, as the prefill kernel (kN = 8) and the megakernel (kN = 2) hold them: per lane
// attn_scale_mask, the max over the quad, per lane attn_exp_tile, the sum over the quad. The state
// and every weight equal the same row held by one thread in key order (the sum up to its order).
template <int kN>
void quad_matches_one_thread(SplitMix64& rng) {
  constexpr int kKeys = 8 * kN;
  // Score i of row h in lane t is key (i / 2) * 8 + 2 t + i % 2 (the accumulator's column).
  auto key_of = [](int t, int i) { return (i >> 1) * 8 + 2 * t + (i & 1); };
  float reach[kN][4] = {};
  for (int h = 0; h < 2; ++h) {  // AttnFragRow reaches each element once, row h in elements 2h, 2h + 1
    for (int i = 0; i < AttnFragRow<kN>::kScores; ++i) {
      float& x = AttnFragRow<kN>{reach, h}(i);
      EXPECT_EQ(x, 0.0f);
      x = 1.0f;
      EXPECT_EQ(&x, &reach[i >> 1][2 * h + (i & 1)]);
    }
  }
  float m_quad[2] = {-INFINITY, -INFINITY}, l_quad[2] = {0, 0}, m_one[2] = {-INFINITY, -INFINITY}, l_one[2] = {0, 0};
  for (int tile = 0; tile < 4; ++tile) {
    float frag[4][kN][4], row[2][kKeys];
    int limit[2];
    for (int h = 0; h < 2; ++h) limit[h] = static_cast<int>(rng.below(kKeys + 4)) - 2;  // sometimes nothing
    for (int t = 0; t < 4; ++t)
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 2 * kN; ++i) {
          const float x = static_cast<float>(rng.normal() * 40.0) + 30.0f * tile;  // later tiles raise the max
          AttnFragRow<kN>{frag[t], h}(i) = x;
          row[h][key_of(t, i)] = x;
        }
    for (int h = 0; h < 2; ++h) {
      float lane_max[4], lane_sum[4];
      AttnTileExp step[4];
      for (int t = 0; t < 4; ++t)
        lane_max[t] = attn_scale_mask(2 * kN, AttnFragRow<kN>{frag[t], h}, attn_scale_log2(kScale),
                                      [&](int i) { return key_of(t, i) <= limit[h]; });
      const float quad_max = std::max(std::max(lane_max[0], lane_max[1]), std::max(lane_max[2], lane_max[3]));
      for (int t = 0; t < 4; ++t) {
        float m = m_quad[h];
        step[t] = attn_exp_tile(m, quad_max, 2 * kN, AttnFragRow<kN>{frag[t], h}, AttnIdentity{});
        lane_sum[t] = step[t].sum;
        if (t == 3) m_quad[h] = m;
      }
      l_quad[h] = l_quad[h] * step[0].alpha + ((lane_sum[0] + lane_sum[1]) + (lane_sum[2] + lane_sum[3]));
      auto one = [&](int i) -> float& { return row[h][i]; };
      const float one_max = attn_scale_mask(kKeys, one, attn_scale_log2(kScale), [&](int i) { return i <= limit[h]; });
      EXPECT_EQ(one_max, quad_max);
      const float alpha = attn_online_step(m_one[h], l_one[h], one_max, kKeys, one, AttnIdentity{}, AttnIdentity{});
      for (int t = 0; t < 4; ++t) EXPECT_EQ(step[t].alpha, alpha);
      EXPECT_EQ(m_quad[h], m_one[h]);
      for (int t = 0; t < 4; ++t)
        for (int i = 0; i < 2 * kN; ++i) EXPECT_EQ((AttnFragRow<kN>{frag[t], h}(i)), row[h][key_of(t, i)]);
      EXPECT_NEAR(l_quad[h], l_one[h], 1e-6f * l_one[h]) << "tile " << tile << " row " << h;
      EXPECT_FALSE(std::isnan(l_quad[h]));
    }
  }
}

TEST(AttentionState, QuadFragmentsStepLikeOneThread) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    quad_matches_one_thread<2>(rng);  // the megakernel's 16-key chunks
    quad_matches_one_thread<8>(rng);  // the prefill kernel's 64-key tiles
  }
}

// With a rounding of the weights (the prefill kernel's bf16 P operand), l sums exactly the weights
// the scores were replaced by, and each is the rounding of 2^(s - m).
TEST(AttentionState, RoundedWeightsAreWhatLSums) {
  SplitMix64 rng(test_seed());
  std::vector<float> s(64);
  for (float& x : s) x = static_cast<float>(rng.normal() * 4.0);
  const std::vector<float> before = s;
  float m = -INFINITY, l = 0.0f;
  auto score = [&](int i) -> float& { return s[i]; };
  const float mx = *std::max_element(s.begin(), s.end());
  attn_online_step(m, l, mx, 64, score, [](float p) { return round_bf16(p); }, AttnIdentity{});
  float sum = 0.0f;
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(s[i], round_bf16(std::exp2(before[i] - mx)));
    sum += s[i];
  }
  EXPECT_EQ(l, sum);
  EXPECT_EQ(m, mx);
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
