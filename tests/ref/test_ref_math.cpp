// sanitize: address thread
// Tests of the reference ops: the documented dot-product order (bitwise), matvec over every dtype
// and thread count (bitwise), norm/RoPE/softmax/attention against double, top-k ties, routing,
// and the thread pool covering every index exactly once.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "ref/math.h"
#include "ref/parallel.h"
#include "ref_test_util.h"

namespace megadecode::ref {
namespace {

std::vector<float> normals(SplitMix64& rng, size_t n) {
  std::vector<float> v(n);
  for (float& x : v) x = rng.normal();
  return v;
}

uint64_t print_seed() {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

TEST(RefOps, DotFollowsTheDocumentedOrder) {
  SplitMix64 rng(print_seed());
  for (int n : {0, 1, 7, 8, 9, 16, 63, 100, 1000}) {
    const std::vector<float> a = normals(rng, n), b = normals(rng, n);
    float lane[kDotLanes] = {};
    double exact = 0;
    for (int i = 0; i < n; ++i) {
      const float product = a[i] * b[i];
      lane[i % kDotLanes] = lane[i % kDotLanes] + product;
      exact += static_cast<double>(a[i]) * b[i];
    }
    const float want = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    const float got = dot(a.data(), b.data(), n);
    EXPECT_EQ(0, std::memcmp(&got, &want, 4)) << "n " << n << ": " << got << " vs " << want;
    EXPECT_NEAR(got, exact, 1e-5 * n + 1e-6);
  }
}

TEST(RefOps, MatvecIsBitwiseTheRowDotForEveryDtypeAndThreadCount) {
  SplitMix64 rng(print_seed());
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) {
    for (auto [rows, cols] : {std::pair<int, int>{37, 130}, {1, 1}, {300, 1000}, {5, 8}}) {
      TensorStore store;
      std::byte* p = store.add("w", dtype, {rows, cols});
      for (int64_t i = 0; i < int64_t{rows} * cols; ++i) test::store_value(p, dtype, i, rng.normal());
      const TensorView& w = store.tensors().at("w");
      const std::vector<float> x = normals(rng, cols);
      std::vector<float> want(rows), row(cols);
      for (int r = 0; r < rows; ++r) {
        load_row(w, r, row.data());
        for (int i = 0; i < cols; ++i) ASSERT_EQ(row[i], w.at(int64_t{r} * cols + i));
        want[r] = dot(row.data(), x.data(), cols);
      }
      std::vector<float> got(rows, NAN);
      matvec(w, x.data(), got.data(), nullptr);
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), rows * 4)) << dtype_name(dtype) << " serial";
      for (int threads : {1, 2, 5}) {
        ThreadPool pool(threads);
        std::fill(got.begin(), got.end(), NAN);
        matvec(w, x.data(), got.data(), &pool);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), rows * 4)) << dtype_name(dtype) << " threads " << threads;
      }
    }
  }
}

TEST(RefOps, ThreadPoolCoversEveryIndexOnce) {
  SplitMix64 rng(print_seed());
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int trial = 0; trial < 200; ++trial) {
      const int64_t n = static_cast<int64_t>(rng.below(100));
      const int64_t grain = 1 + static_cast<int64_t>(rng.below(10));
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
        ASSERT_LE(0, begin);
        ASSERT_LE(begin, end);
        ASSERT_LE(end, n);
        for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
    }
  }
}

TEST(RefOps, RmsNormNormalisesThenMultipliesByTheWeight) {
  SplitMix64 rng(print_seed());
  const int n = 77;
  const std::vector<float> x = normals(rng, n), w = normals(rng, n);
  std::vector<float> got(n);
  rms_norm(x.data(), w.data(), 1e-6f, n, got.data());
  const float inv = 1.0f / std::sqrt(dot(x.data(), x.data(), n) / n + 1e-6f);
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv_exact = 1.0 / std::sqrt(ss / n + 1e-6);
  for (int i = 0; i < n; ++i) {
    const float want = (x[i] * inv) * w[i];
    EXPECT_EQ(0, std::memcmp(&got[i], &want, 4)) << i;
    EXPECT_NEAR(got[i], x[i] * inv_exact * w[i], 1e-5);
  }
  std::vector<float> in_place = x;
  rms_norm(in_place.data(), w.data(), 1e-6f, n, in_place.data());
  EXPECT_EQ(0, std::memcmp(in_place.data(), got.data(), n * 4));
}

TEST(RefOps, RopeMatchesTheRotationFormula) {
  SplitMix64 rng(print_seed());
  const int d = 16;
  const std::vector<float> inv = rope_inv_freq(d, 1e6);
  for (int i = 0; i < d / 2; ++i) {
    const float want = 1.0f / std::pow(1e6f, static_cast<float>(2 * i) / static_cast<float>(d));
    EXPECT_EQ(inv[i], want);
  }
  EXPECT_EQ(inv[0], 1.0f);
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kInterleaved}) {
    const std::vector<float> x = normals(rng, d);
    std::vector<float> y = x;
    apply_rope(y.data(), d, 0, inv, style);
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), d * 4)) << "position 0 is the identity";
    const int pos = 1 + static_cast<int>(rng.below(5000));
    y = x;
    apply_rope(y.data(), d, pos, inv, style);
    for (int i = 0; i < d / 2; ++i) {
      const int a = style == RopeStyle::kNeox ? i : 2 * i, b = style == RopeStyle::kNeox ? i + d / 2 : 2 * i + 1;
      const double angle = static_cast<float>(pos) * inv[i];  // the angle is rounded to fp32, as in HF
      EXPECT_NEAR(y[a], x[a] * std::cos(angle) - x[b] * std::sin(angle), 1e-5) << "pos " << pos << " pair " << i;
      EXPECT_NEAR(y[b], x[b] * std::cos(angle) + x[a] * std::sin(angle), 1e-5) << "pos " << pos << " pair " << i;
    }
  }
  // Relative positions: <rope(q, m), rope(k, n)> depends on m - n only.
  const std::vector<float> q = normals(rng, d), k = normals(rng, d);
  auto score = [&](int m, int n) {
    std::vector<float> a = q, b = k;
    apply_rope(a.data(), d, m, inv, RopeStyle::kNeox);
    apply_rope(b.data(), d, n, inv, RopeStyle::kNeox);
    return dot(a.data(), b.data(), d);
  };
  EXPECT_NEAR(score(10, 3), score(107, 100), 1e-4);
}

TEST(RefOps, SoftmaxAndAttention) {
  SplitMix64 rng(print_seed());
  std::vector<float> s = {1.0f, -INFINITY, 3.0f, 0.5f};
  softmax(s.data(), 4);
  EXPECT_EQ(s[1], 0.0f);
  EXPECT_NEAR(s[0] + s[2] + s[3], 1.0f, 1e-6);
  EXPECT_GT(s[2], s[0]);

  const int d = 16, n = 13;
  const std::vector<float> q = normals(rng, d);
  std::vector<std::vector<float>> k(n), v(n);
  std::vector<const float*> kp(n), vp(n);
  for (int j = 0; j < n; ++j) {
    k[j] = normals(rng, d);
    v[j] = normals(rng, d);
    kp[j] = k[j].data();
    vp[j] = v[j].data();
  }
  std::vector<float> out(d);
  attention_head(q.data(), std::span(kp).first(1), std::span(vp).first(1), d, 0.25f, out.data());
  EXPECT_EQ(0, std::memcmp(out.data(), v[0].data(), d * 4)) << "one key: the output is its value";
  attention_head(q.data(), kp, vp, d, 0.25f, out.data());
  std::vector<double> p(n);
  double sum = 0;
  for (int j = 0; j < n; ++j) {
    double sc = 0;
    for (int i = 0; i < d; ++i) sc += static_cast<double>(q[i]) * k[j][i];
    sum += p[j] = std::exp(sc * 0.25);
  }
  for (int i = 0; i < d; ++i) {
    double want = 0;
    for (int j = 0; j < n; ++j) want += p[j] / sum * v[j][i];
    EXPECT_NEAR(out[i], want, 1e-5);
  }
}

TEST(RefOps, TopKTiesGoToTheLowerIndexAndNanRanksLast) {
  const std::vector<float> s = {1.0f, 3.0f, NAN, 3.0f, 2.0f, 3.0f};
  EXPECT_EQ(top_k(s.data(), 6, 4), (std::vector<int>{1, 3, 5, 4}));
  EXPECT_EQ(top_k(s.data(), 6, 6), (std::vector<int>{1, 3, 5, 4, 0, 2}));
  EXPECT_TRUE(top_k(s.data(), 6, 0).empty());
}

TEST(RefOps, RoutingSoftmaxRenormAndSigmoid) {
  SplitMix64 rng(print_seed());
  ModelConfig c = test::small_moe_config();
  c.n_experts = 10;
  c.n_experts_per_tok = 3;
  std::vector<float> logits = normals(rng, 10);
  const auto soft = route(logits.data(), c);
  ASSERT_EQ(soft.size(), 3u);
  EXPECT_NEAR(soft[0].second + soft[1].second + soft[2].second, 1.0f, 1e-6);
  EXPECT_GE(soft[0].second, soft[1].second);
  EXPECT_GE(soft[1].second, soft[2].second);
  const std::vector<int> best = top_k(logits.data(), 10, 3);
  // The renormalised softmax weights are the softmax over the selected logits.
  double z = 0;
  for (int e : best) z += std::exp(static_cast<double>(logits[e]));
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(soft[j].first, best[j]);
    EXPECT_NEAR(soft[j].second, std::exp(static_cast<double>(logits[best[j]])) / z, 1e-6);
  }
  c.router = RouterKind::kSigmoidTopK;
  c.norm_topk_prob = false;
  const auto sig = route(logits.data(), c);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(sig[j].first, best[j]);
    EXPECT_NEAR(sig[j].second, 1.0 / (1.0 + std::exp(-static_cast<double>(logits[best[j]]))), 1e-6);
  }
  std::vector<float> tied(10, 0.5f);
  const auto tie = route(tied.data(), c);
  EXPECT_EQ(tie[0].first, 0);
  EXPECT_EQ(tie[1].first, 1);
  EXPECT_EQ(tie[2].first, 2);
}

}  // namespace
}  // namespace megadecode::ref
