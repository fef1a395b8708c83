// Pure-read bandwidth kernel: the ceiling every decode number is quoted against. Each thread keeps
// `unroll` independent 16-byte non-coherent loads in flight (read-only data), folds them with XOR,
// and one word per CTA is written so the compiler cannot drop the loads.
#include <algorithm>
#include <cstdio>

#include "bench/gpu/bandwidth.h"
#include "bench/gpu/event_timer.h"
#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_info.h"

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
  const int grid = sm_count() * blocks_per_sm;
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

double measure_read_ceiling(size_t bytes, int reps, nlohmann::json& records, bool print) {
  MD_REQUIRE(bytes >= (size_t{1} << 20) && bytes % 16 == 0, "read ceiling buffer of ", bytes, " bytes");
  MD_REQUIRE(reps >= 1, "read ceiling: ", reps, " repetitions");
  constexpr int kSinkWords = 8192;  // >= SMs x blocks per SM of every shape
  void* buf = nullptr;
  uint32_t* sink = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, bytes));
  CUDA_CHECK(cudaMemset(buf, 0x5a, bytes));
  CUDA_CHECK(cudaMalloc(&sink, kSinkWords * sizeof(uint32_t)));
  CUDA_CHECK(cudaMemset(sink, 0, kSinkWords * sizeof(uint32_t)));
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct Shape {
    int blocks_per_sm, threads, unroll;
  };
  const Shape shapes[] = {{1, 1024, 4}, {2, 512, 4}, {2, 512, 8}, {2, 1024, 4}, {4, 512, 4}, {1, 1024, 8}};
  double best = 0;
  for (const Shape& sh : shapes) {
    const double med = median_event_ms(
        stream, 2, reps, [&] { read_bandwidth(buf, bytes, sh.blocks_per_sm, sh.threads, sh.unroll, sink, stream); });
    const double gbps = static_cast<double>(bytes) / (med * 1e-3) / 1e9;
    best = std::max(best, gbps);
    const int in_flight_kb = sh.blocks_per_sm * sh.threads * sh.unroll * 16 / 1024;
    records.push_back({{"blocks_per_sm", sh.blocks_per_sm}, {"threads", sh.threads}, {"unroll", sh.unroll},
                       {"in_flight_kb_per_sm", in_flight_kb}, {"bytes", bytes}, {"ms", med}, {"gbps", gbps}});
    if (print)
      std::printf("  %d x %4d thr x %d loads (%3d KB/SM in flight): %8.1f GB/s\n", sh.blocks_per_sm, sh.threads,
                  sh.unroll, in_flight_kb, gbps);
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFree(sink));
  CUDA_CHECK(cudaFree(buf));
  return best;
}

}  // namespace megadecode::cuda
