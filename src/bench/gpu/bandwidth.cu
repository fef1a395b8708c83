// Pure-read bandwidth kernel: the ceiling every decode number is quoted against. Each thread keeps
// `unroll` independent 16-byte non-coherent loads in flight (read-only data), folds them with XOR,
// and one word per CTA is written so the compiler cannot drop the loads.
#include <algorithm>

#include "bench/gpu/bandwidth.h"
#include "core/check.h"
#include "cuda/common/cuda_check.h"

namespace megadecode::cuda {
namespace {

template <int kUnroll>
__global__ void read_kernel(const uint4* __restrict__ src, size_t n_vec, uint32_t* sink) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  for (; i + (kUnroll - 1) * stride < n_vec; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint4* p = src + i + u * stride;
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                   : "l"(p));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n_vec; i += stride) {
    const uint4 v = src[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  // Warp-reduce so the store is one per CTA-warp; the value is meaningless.
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicXor(&sink[blockIdx.x], acc);
}

}  // namespace

void read_bandwidth(const void* src, size_t bytes, int blocks_per_sm, int threads, int unroll, uint32_t* sink,
                    cudaStream_t stream) {
  MD_REQUIRE(bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0, "read_bandwidth: 16-byte units only");
  MD_REQUIRE(threads % 32 == 0 && threads >= 32 && threads <= 1024, "read_bandwidth: threads ", threads);
  int dev = 0, n_sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, dev));
  const int grid = n_sms * blocks_per_sm;
  const auto* p = static_cast<const uint4*>(src);
  const size_t n = bytes / 16;
  switch (unroll) {
    case 1: read_kernel<1><<<grid, threads, 0, stream>>>(p, n, sink); break;
    case 2: read_kernel<2><<<grid, threads, 0, stream>>>(p, n, sink); break;
    case 4: read_kernel<4><<<grid, threads, 0, stream>>>(p, n, sink); break;
    case 8: read_kernel<8><<<grid, threads, 0, stream>>>(p, n, sink); break;
    default: throw Error(cat("read_bandwidth: unroll ", unroll, " not one of 1, 2, 4, 8"));
  }
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda
