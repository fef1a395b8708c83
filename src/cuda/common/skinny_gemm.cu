// Standalone skinny GEMM kernel: one CTA per SM grid-strides over tiles; one loader warp streams
// every (tile, k-stage) page into a ring of shared-memory pages (bulk copies completing on "full"
// mbarriers), eight consumer warps run the MMAs and release pages on "empty" mbarriers.
#include <algorithm>

#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_info.h"
#include "cuda/common/kernels.h"
#include "cuda/common/skinny_gemm.cuh"

namespace megadecode::cuda {
namespace {

constexpr int kMaxStages = 16;
constexpr int kBarBytes = 2 * kMaxStages * 8;

template <int kNT>
__global__ void __launch_bounds__(kGemmThreads, 1) skinny_gemm_kernel(const SkinnyGemmArgs a, int n_stages) {
  using T = GemmTile<kNT>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kMaxStages;
  float* red = reinterpret_cast<float*>(smem + kBarBytes);
  uint8_t* pages = smem + kBarBytes + T::kRedBytes;

  const int warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    for (int s = 0; s < n_stages; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], kGemmConsumerWarps);
    }
    ptx::fence_mbar_init();
  }
  __syncthreads();

  const int n_tiles = gemm_n_tiles(a.n_rows, T::kMT);
  const int n_kstages = gemm_n_stages(a.k, T::kStageK);
  const int n_kb = static_cast<int>(pack_k_blocks(a.k));

  if (warp == kGemmConsumerWarps) {  // loader
    const uint64_t policy = ptx::policy_evict_first();
    uint32_t it = 0;
    for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
      for (int s = 0; s < n_kstages; ++s, ++it) {
        const uint32_t slot = it % n_stages, phase = (it / n_stages) & 1;
        ptx::mbar_wait(&empty[slot], phase ^ 1);
        gemm_issue_stage<kNT>(a, tile, s, pages + slot * T::kPageBytes, &full[slot], policy);
      }
    }
    return;
  }

  // consumers
  const int lane = threadIdx.x & 31;
  uint32_t it = 0;
  for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    float acc[T::kMT][kNT][4];
#pragma unroll
    for (int m = 0; m < T::kMT; ++m)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.0f;
    for (int s = 0; s < n_kstages; ++s, ++it) {
      const uint32_t slot = it % n_stages, phase = (it / n_stages) & 1;
      ptx::mbar_wait(&full[slot], phase);
      gemm_consume_stage<kNT>(acc, pages + slot * T::kPageBytes, min(T::kStageKB, n_kb - s * T::kStageKB), warp);
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(&empty[slot]);
    }
    gemm_reduce_store<kNT>(acc, red, a, tile, warp, 1);
  }
}

struct DeviceLimits {
  int n_sms = 0;
  int smem_optin = 0;
};

const DeviceLimits& device_limits() {
  static const DeviceLimits limits = [] {
    DeviceLimits l;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    l.n_sms = sm_count();
    CUDA_CHECK(cudaDeviceGetAttribute(&l.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return l;
  }();
  return limits;
}

template <int kNT>
void launch(const SkinnyGemmArgs& a, cudaStream_t stream) {
  using T = GemmTile<kNT>;
  const DeviceLimits& lim = device_limits();
  const int fixed = kBarBytes + T::kRedBytes;
  const int n_stages = std::min(kMaxStages, (lim.smem_optin - fixed) / T::kPageBytes);
  MD_CHECK(n_stages >= 2, "skinny_gemm: shared memory too small");
  const int smem = fixed + n_stages * T::kPageBytes;
  static bool configured = false;  // per instantiation
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(skinny_gemm_kernel<kNT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  const int grid = std::min(gemm_n_tiles(a.n_rows, T::kMT), lim.n_sms);
  skinny_gemm_kernel<kNT><<<grid, kGemmThreads, smem, stream>>>(a, n_stages);
  CUDA_CHECK_LAST();
}

}  // namespace

void skinny_gemm(const SkinnyGemmArgs& a, cudaStream_t stream) {
  MD_REQUIRE(a.n_tokens >= 1 && a.n_tokens <= kGemmMaxTokens, "skinny_gemm: n_tokens ", a.n_tokens,
             " outside 1..", kGemmMaxTokens);
  MD_REQUIRE(a.n_rows > 0, "skinny_gemm: n_rows ", a.n_rows, " must be positive");
  MD_REQUIRE(a.k > 0 && a.k % 16 == 0, "skinny_gemm: k ", a.k, " must be a positive multiple of 16");
  MD_REQUIRE(a.x_stride >= a.k && a.x_stride % 8 == 0, "skinny_gemm: x_stride ", a.x_stride,
             " must be >= k and a multiple of 8");
  MD_REQUIRE(a.y_stride >= a.n_rows, "skinny_gemm: y_stride ", a.y_stride, " < n_rows ", a.n_rows);
  MD_REQUIRE(reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w_packed) % 16 == 0,
             "skinny_gemm: x and w_packed must be 16-byte aligned");
  switch ((a.n_tokens + 7) / 8) {
    case 1: return launch<1>(a, stream);
    case 2: return launch<2>(a, stream);
    case 3: return launch<3>(a, stream);
    case 4: return launch<4>(a, stream);
    case 5: return launch<5>(a, stream);
    case 6: return launch<6>(a, stream);
    case 7: return launch<7>(a, stream);
    default: return launch<8>(a, stream);
  }
}

}  // namespace megadecode::cuda
