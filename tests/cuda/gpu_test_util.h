// Helpers shared by the GPU tests: device buffers, NaN poison, random bf16 data, error measures.
// A test calls MD_REQUIRE_GPU() first: with no GPU it FAILS, unless MEGADECODE_ALLOW_NO_GPU is set
// (then it skips), so a GPU run can never pass silently without a GPU.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.h"
#include "core/rng.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_info.h"

#define MD_REQUIRE_GPU()                                                                        \
  do {                                                                                          \
    if (!::megadecode::cuda::gpu_available()) {                                                 \
      if (std::getenv("MEGADECODE_ALLOW_NO_GPU") != nullptr) GTEST_SKIP() << "no GPU (allowed)"; \
      FAIL() << "no CUDA GPU found (set MEGADECODE_ALLOW_NO_GPU=1 to skip instead)";            \
    }                                                                                           \
  } while (0)

namespace megadecode::test {

// MEGADECODE_GPU_QUICK=1 (set by `scripts/gpu quick`): tests run at reduced sizes (fewer batches,
// shorter contexts and prompts) so the whole correctness loop fits a few minutes. The checks and
// their bounds are the same; only the sizes shrink.
inline bool gpu_quick() {
  const char* v = std::getenv("MEGADECODE_GPU_QUICK");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) { CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr; }

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // Fills every byte with `byte` (0xFF: NaN for fp32 and bf16 alike).
  void fill_bytes(int byte) { CUDA_CHECK(cudaMemset(ptr_, byte, n_ * sizeof(T))); }
  void poison() { fill_bytes(0xFF); }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// Random bf16 values (as bits) with their exact float values, scale * N(0,1)-ish (uniform [-1,1) x scale).
struct Bf16Data {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
inline Bf16Data random_bf16(size_t n, SplitMix64& rng, float scale = 1.0f) {
  Bf16Data d;
  d.bits.resize(n);
  d.values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = scale * (2.0f * rng.unit() - 1.0f);
    d.bits[i] = float_to_bf16_bits(v);
    d.values[i] = bf16_bits_to_float(d.bits[i]);
  }
  return d;
}

inline std::vector<float> bf16_to_float(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_bits_to_float(bits[i]);
  return out;
}

// max |out - ref| / max |ref| over the listed elements; any NaN/inf in out -> +inf.
struct ErrorReport {
  double max_abs_err = 0;
  double max_abs_ref = 0;
  size_t worst = 0;
  size_t n_bad = 0;  // non-finite outputs (unwritten NaN poison or real NaN)
  double rel() const { return n_bad ? INFINITY : (max_abs_ref > 0 ? max_abs_err / max_abs_ref : max_abs_err); }
};
inline ErrorReport compare(const std::vector<float>& out, const std::vector<float>& ref) {
  ErrorReport r;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) {
      ++r.n_bad;
      continue;
    }
    const double e = std::fabs(double(out[i]) - double(ref[i]));
    if (e > r.max_abs_err) {
      r.max_abs_err = e;
      r.worst = i;
    }
    r.max_abs_ref = std::max(r.max_abs_ref, std::fabs(double(ref[i])));
  }
  return r;
}

inline bool bitwise_equal(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

// The test's seed, printed once per call site so a failure can be reproduced (MEGADECODE_SEED).
inline uint64_t seed_for(const char* what) {
  const uint64_t s = test_seed();
  std::printf("[seed] %s: MEGADECODE_SEED=0x%016llx\n", what, static_cast<unsigned long long>(s));
  return s;
}

}  // namespace megadecode::test
