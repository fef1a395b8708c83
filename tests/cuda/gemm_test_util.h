// Helpers of the GPU tests of weight GEMMs (test_gemm.cu, test_prefill_ops.cu): the SiLU reference,
// the bf16 error bound, and random weights packed on the device.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda/common/kernels.h"
#include "gpu_test_util.h"

namespace megadecode::test {

inline double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }

// |got - want| <= 2^-7 |want| + atol * max |want| (bf16 outputs: one rounding apart; fp32 outputs
// far inside); non-finite outputs fail. Returns the worst ratio to that bound.
inline double worst_ratio(const std::vector<float>& got, const std::vector<double>& want, double atol) {
  double mref = 0;
  for (double w : want) mref = std::max(mref, std::fabs(w));
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double bound = std::ldexp(std::fabs(want[i]), -7) + atol * mref + 1e-30;
    worst = std::max(worst, std::fabs(got[i] - want[i]) / bound);
  }
  return worst;
}

// Random row-major [rows][k] bf16 weights, packed on the device at dst.
inline test::Bf16Data packed_weights(uint16_t* dst, int rows, int k, SplitMix64& rng, float scale) {
  test::Bf16Data w = test::random_bf16(static_cast<size_t>(rows) * k, rng, scale);
  test::DeviceBuffer<uint16_t> raw(w.bits);
  cuda::pack_weight(raw.get(), dst, rows, k, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return w;
}

}  // namespace megadecode::test
