// GPU tests of RMSNorm, the router top-k, SiLU*up and the MoE combine against CPU references.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "core/check.h"
#include "cuda/common/kernels.h"
#include "../gpu_test_util.h"
#include "../kernels/kernels.h"

namespace megadecode::cuda {
namespace {

using test::DeviceBuffer;

TEST(RmsNorm, MatchesReferenceBf16AndF32Inputs) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("RmsNorm"));
  for (int n : {128, 2048, 1000}) {
    for (int rows : {1, 3, 17, 64}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " rows=" << rows);
      const int stride = n + 8;
      auto x = test::random_bf16(size_t(rows) * stride, rng, 3.0f);
      auto w = test::random_bf16(n, rng, 2.0f);
      std::vector<float> ref(size_t(rows) * n);
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < n; ++i) ss += double(x.values[r * stride + i]) * x.values[r * stride + i];
        const float inv = 1.0f / std::sqrt(float(ss / n) + 1e-6f);
        for (int i = 0; i < n; ++i) ref[r * n + i] = round_bf16(round_bf16(x.values[r * stride + i] * inv) * w.values[i]);
      }
      DeviceBuffer<uint16_t> dx(x.bits), dw(w.bits), out(size_t(rows) * n);
      DeviceBuffer<float> dxf(x.values);
      for (int variant = 0; variant < 2; ++variant) {
        out.poison();
        if (variant == 0)
          rms_norm(dx.get(), stride, dw.get(), out.get(), n, rows, n, 1e-6f, nullptr);
        else
          rms_norm(dxf.get(), stride, dw.get(), out.get(), n, rows, n, 1e-6f, nullptr);
        const auto got = test::bf16_to_float(out.download());
        const auto rep = test::compare(got, ref);
        // Both sides round to bf16 at the same points; only the fp32 statistic's order differs.
        EXPECT_LE(rep.rel(), 1e-2) << "variant " << variant << " worst " << rep.worst;
        const auto again = out.download();
        rms_norm(dx.get(), stride, dw.get(), out.get(), n, rows, n, 1e-6f, nullptr);
        if (variant == 0) {
          const auto rerun = out.download();
          EXPECT_TRUE(test::bitwise_equal(again.data(), rerun.data(), again.size() * 2));
        }
      }
    }
  }
}

TEST(Router, SoftmaxTopKWithTiesToLowerIndex) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("Router"));
  for (auto [n_experts, top_k] : {std::pair{128, 8}, std::pair{16, 4}, std::pair{60, 7}}) {
    for (int n_tokens : {1, 3, 17, 64}) {
      SCOPED_TRACE(::testing::Message() << "E=" << n_experts << " k=" << top_k << " tokens=" << n_tokens);
      std::vector<float> logits(size_t(n_tokens) * n_experts);
      for (auto& v : logits) v = rng.normal() * 2.0f;
      // Exact ties: token 0 gets duplicated values so the lower index must win.
      for (int e = 0; e < n_experts; e += 2) logits[e + 1 < n_experts ? e + 1 : e] = logits[e];
      DeviceBuffer<float> dl(logits), dw(size_t(n_tokens) * top_k);
      DeviceBuffer<int32_t> di(size_t(n_tokens) * top_k);
      for (bool renorm : {true, false}) {
        dw.poison();
        di.poison();
        router_topk(dl.get(), n_experts, n_tokens, n_experts, top_k, renorm, di.get(), dw.get(), nullptr);
        const auto ids = di.download();
        const auto ws = dw.download();
        for (int t = 0; t < n_tokens; ++t) {
          const float* l = &logits[size_t(t) * n_experts];
          const float mx = *std::max_element(l, l + n_experts);
          std::vector<double> p(n_experts);
          double sum = 0;
          for (int e = 0; e < n_experts; ++e) sum += (p[e] = std::exp(double(l[e]) - mx));
          for (auto& v : p) v /= sum;
          std::vector<int> order(n_experts);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
          double picked = 0;
          for (int r = 0; r < top_k; ++r) picked += p[order[r]];
          for (int r = 0; r < top_k; ++r) {
            ASSERT_EQ(ids[t * top_k + r], order[r]) << "token " << t << " rank " << r;
            const double want = renorm ? p[order[r]] / picked : p[order[r]];
            EXPECT_NEAR(ws[t * top_k + r], want, 1e-5 * std::max(1.0, want));
          }
        }
      }
    }
  }
}

TEST(SiluMul, MatchesReference) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("SiluMul"));
  for (int rows : {1, 17, 512}) {
    const int inter = 768, stride = 2 * inter + 4;
    std::vector<float> gu(size_t(rows) * stride);
    for (auto& v : gu) v = rng.normal() * 3.0f;
    DeviceBuffer<float> dgu(gu);
    DeviceBuffer<uint16_t> out(size_t(rows) * inter);
    out.poison();
    silu_mul(dgu.get(), stride, out.get(), inter, rows, inter, nullptr);
    const auto got = test::bf16_to_float(out.download());
    std::vector<float> ref(got.size());
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < inter; ++i) {
        const float g = gu[r * stride + i], u = gu[r * stride + inter + i];
        ref[r * inter + i] = g / (1.0f + std::exp(-g)) * u;
      }
    EXPECT_LE(test::compare(got, ref).rel(), 1e-2);  // one bf16 rounding of the output
  }
}

TEST(MoeCombine, FixedOrderSumPlusResidual) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("MoeCombine"));
  for (int n_tokens : {1, 3, 64}) {
    const int top_k = 8, n = 2048;
    std::vector<float> parts(size_t(n_tokens) * top_k * n), w(size_t(n_tokens) * top_k), res(size_t(n_tokens) * n);
    for (auto& v : parts) v = rng.normal();
    for (auto& v : w) v = rng.unit();
    for (auto& v : res) v = rng.normal() * 4.0f;
    DeviceBuffer<float> dp(parts), dw(w), dr(res), out(res.size());
    for (bool weighted : {true, false}) {
      out.poison();
      moe_combine(dp.get(), weighted ? dw.get() : nullptr, dr.get(), out.get(), n_tokens, top_k, n, nullptr);
      const auto got = out.download();
      std::vector<float> ref(res.size());
      for (int t = 0; t < n_tokens; ++t)
        for (int h = 0; h < n; ++h) {
          float s = 0.0f;  // the same fp32 order as the device: exact equality expected
          for (int k = 0; k < top_k; ++k) s += (weighted ? w[t * top_k + k] : 1.0f) * parts[(size_t(t) * top_k + k) * n + h];
          ref[size_t(t) * n + h] = res[size_t(t) * n + h] + s;
        }
      const auto rep = test::compare(got, ref);
      EXPECT_EQ(rep.n_bad, 0u);
      EXPECT_LE(rep.rel(), 1e-6);  // FMA contraction on the device may differ by an ulp
    }
  }
}

TEST(NormMoe, RejectsBadArguments) {
  EXPECT_THROW(router_topk(nullptr, 300, 1, 300, 8, true, nullptr, nullptr, nullptr), Error);
  EXPECT_THROW(router_topk(nullptr, 128, 1, 128, 0, true, nullptr, nullptr, nullptr), Error);
  EXPECT_THROW(rms_norm(static_cast<const float*>(nullptr), 10, nullptr, nullptr, 20, 1, 20, 1e-6f, nullptr), Error);
}

}  // namespace
}  // namespace megadecode::cuda
