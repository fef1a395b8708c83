// GPU tests of the packed weight layout and the skinny GEMM against fp32/double CPU references.
#include <algorithm>
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>

#include "core/check.h"
#include "cuda/common/kernels.h"
#include "cuda/common/weight_pack.cuh"
#include "gpu_test_util.h"
#include "kernels/kernels.h"

namespace megadecode::cuda {
namespace {

using test::DeviceBuffer;

TEST(WeightPack, OffsetAndCoordAreInverse) {
  for (int n_rows : {16, 37, 64}) {
    for (int k : {16, 48, 100}) {
      const int64_t n_kb = pack_k_blocks(k);
      std::vector<int> seen(packed_elements(n_rows, k), 0);
      for (int r = 0; r < n_rows; ++r)
        for (int c = 0; c < k; ++c) {
          const int64_t off = packed_offset(r, c, n_kb);
          ASSERT_LT(off, static_cast<int64_t>(seen.size()));
          ++seen[off];
          const PackedCoord pc = packed_coord(off, n_kb);
          ASSERT_EQ(pc.row, r);
          ASSERT_EQ(pc.k, c);
        }
      for (size_t i = 0; i < seen.size(); ++i) {
        const PackedCoord pc = packed_coord(static_cast<int64_t>(i), n_kb);
        const bool inside = pc.row < n_rows && pc.k < k;
        ASSERT_EQ(seen[i], inside ? 1 : 0) << "offset " << i;
      }
    }
  }
}

TEST(WeightPack, PackKernelMatchesMapping) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("WeightPack.PackKernelMatchesMapping"));
  for (auto [n_rows, k] : {std::pair{37, 48}, std::pair{128, 2048}, std::pair{5, 16}}) {
    auto w = test::random_bf16(size_t(n_rows) * k, rng);
    DeviceBuffer<uint16_t> dw(w.bits), dp(packed_elements(n_rows, k));
    dp.poison();
    pack_weight(dw.get(), dp.get(), n_rows, k, nullptr);
    const auto packed = dp.download();
    const int64_t n_kb = pack_k_blocks(k);
    for (size_t i = 0; i < packed.size(); ++i) {
      const PackedCoord c = packed_coord(static_cast<int64_t>(i), n_kb);
      const uint16_t want = (c.row < n_rows && c.k < k) ? w.bits[c.row * k + c.k] : 0;
      ASSERT_EQ(packed[i], want) << "offset " << i << " shape " << n_rows << "x" << k;
    }
  }
}

TEST(WeightPack, FillPackedUniformEqualsPackOfRowMajor) {
  MD_REQUIRE_GPU();
  const uint64_t seed = test::seed_for("WeightPack.FillPackedUniform");
  const int n_rows = 77, k = 96;
  std::vector<uint16_t> w(size_t(n_rows) * k);
  for (int r = 0; r < n_rows; ++r)
    for (int c = 0; c < k; ++c) w[size_t(r) * k + c] = float_to_bf16_bits(0.02f * uniform_at(seed, 7, uint64_t(r) * k + c));
  DeviceBuffer<uint16_t> dw(w), a(packed_elements(n_rows, k)), b(packed_elements(n_rows, k));
  a.poison();
  b.poison();
  pack_weight(dw.get(), a.get(), n_rows, k, nullptr);
  fill_packed_uniform(b.get(), n_rows, k, seed, 7, 0.02f, nullptr);
  const auto ha = a.download(), hb = b.download();
  EXPECT_TRUE(test::bitwise_equal(ha.data(), hb.data(), ha.size() * 2));
}

// Runs the GEMM for one shape and batch; returns Y downloaded. Checks against the CPU reference on
// rows r with r % row_step == 0.
std::vector<float> run_gemm(const DeviceBuffer<uint16_t>& packed, const DeviceBuffer<uint16_t>& x, int n_rows, int k,
                            int n_tokens, int x_stride) {
  DeviceBuffer<float> y(size_t(n_tokens) * n_rows);
  y.poison();
  SkinnyGemmArgs a{packed.get(), x.get(), y.get(), n_rows, k, n_tokens, x_stride, n_rows};
  skinny_gemm(a, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return y.download();
}

void check_gemm(int n_rows, int k, int n_tokens, int row_step, SplitMix64& rng) {
  SCOPED_TRACE(::testing::Message() << "N=" << n_rows << " K=" << k << " B=" << n_tokens);
  const int x_stride = k + 8;  // a view with padding: the kernel must honour the stride
  auto w = test::random_bf16(size_t(n_rows) * k, rng, 0.05f);
  auto x = test::random_bf16(size_t(n_tokens) * x_stride, rng, 1.0f);
  DeviceBuffer<uint16_t> dw(w.bits), dp(packed_elements(n_rows, k)), dx(x.bits);
  pack_weight(dw.get(), dp.get(), n_rows, k, nullptr);
  const auto y = run_gemm(dp, dx, n_rows, k, n_tokens, x_stride);
  std::vector<float> out, ref;
  for (int t = 0; t < n_tokens; ++t)
    for (int r = 0; r < n_rows; r += row_step) {
      double s = 0;
      for (int c = 0; c < k; ++c) s += double(w.values[size_t(r) * k + c]) * x.values[size_t(t) * x_stride + c];
      ref.push_back(static_cast<float>(s));
      out.push_back(y[size_t(t) * n_rows + r]);
    }
  // Every element written (not just the checked rows).
  size_t n_nan = 0;
  for (float v : y) n_nan += std::isfinite(v) ? 0 : 1;
  EXPECT_EQ(n_nan, 0u) << "unwritten or non-finite outputs";
  const auto rep = test::compare(out, ref);
  // Exact bf16 inputs, fp32 accumulation: only summation-order rounding remains.
  EXPECT_LE(rep.rel(), 1e-4) << "max abs err " << rep.max_abs_err << " at " << rep.worst << ", max |ref| " << rep.max_abs_ref;
  // Bitwise determinism on a repeat.
  const auto y2 = run_gemm(dp, dx, n_rows, k, n_tokens, x_stride);
  EXPECT_TRUE(test::bitwise_equal(y.data(), y2.data(), y.size() * 4)) << "repeat differs";
  // Batch invariance: token 0 alone gives the same bits as inside the batch.
  if (n_tokens > 1) {
    const auto y1 = run_gemm(dp, dx, n_rows, k, 1, x_stride);
    EXPECT_TRUE(test::bitwise_equal(y.data(), y1.data(), size_t(n_rows) * 4)) << "batch-variant result";
  }
}

TEST(SkinnyGemm, AwkwardShapesAndBatches) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("SkinnyGemm.AwkwardShapesAndBatches"));
  for (int b : {1, 3, 8, 17, 64})
    for (auto [n, k] : {std::pair{16, 16}, std::pair{40, 144}, std::pair{200, 768}, std::pair{1000, 1040}})
      check_gemm(n, k, b, 1, rng);
}

TEST(SkinnyGemm, ModelShapes) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("SkinnyGemm.ModelShapes"));
  const std::pair<int, int> shapes[] = {{5120, 2048}, {2048, 4096}, {1536, 2048}, {2048, 768}, {128, 2048}};
  for (int b : {1, 8, 17, 64})
    for (auto [n, k] : shapes) check_gemm(n, k, b, 3, rng);
}

TEST(SkinnyGemm, LmHeadShape) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("SkinnyGemm.LmHeadShape"));
  for (int b : {1, 9, 64}) check_gemm(151936, 2048, b, 97, rng);
}

TEST(SkinnyGemm, RejectsBadArguments) {
  SkinnyGemmArgs a{nullptr, nullptr, nullptr, 16, 24, 1, 24, 16};
  EXPECT_THROW(skinny_gemm(a, nullptr), Error);  // k not a multiple of 16
  a.k = 16;
  a.n_tokens = 65;
  EXPECT_THROW(skinny_gemm(a, nullptr), Error);
}

}  // namespace
}  // namespace megadecode::cuda
