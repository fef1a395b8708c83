// The megakernel's loading and consuming mechanism measured alone: one loader thread per CTA streams
// pages with cp.async.bulk into a ring of shared-memory pages (mbarrier complete_tx), consumers
// wait for each page and release it. This is the ceiling of what a decode task's weight stream can
// reach per SM, with 1 SM or all of them active, from HBM (distinct bytes) and from L2 (each CTA
// re-reads a small region), and what each part of the megakernel's GEMM consumer costs on top
// (StreamConsumer). The timing model's stream and consumer rates come from here
// (plan/simulate_params.cpp).
#include <algorithm>
#include <cstdio>

#include "bench/gpu/stream.h"
#include "bench/gpu/event_timer.h"
#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_info.h"
#include "cuda/common/ptx.cuh"
#include "cuda/common/packed_mma.cuh"
#include "cuda/common/weight_pack.cuh"

namespace megadecode::cuda {
namespace {

constexpr int kMaxSlots = 8;
constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 1) * 32;  // warp 8 lane 0 loads
// The megakernel's batch <= 8 page: one 16-row block x 512 k of weights, then one token group's
// activation row (pitch + 16 bytes), and the warp-partial reduction buffer of one row block.
struct Tile {
  static constexpr int kMT = 1, kStageK = 512, kStageKB = kStageK / kPackK;
  static constexpr int kWBytes = kMT * kStageKB * kPackTileBytes;
  static constexpr int kXPitch = kStageK * 2 + 16;
  static constexpr int kPageBytes = (kWBytes + 8 * kXPitch + 127) / 128 * 128;
  static constexpr int kRedPitch = 16 + 1;
  static constexpr int kRedBytes = kConsumerWarps * 8 * kRedPitch * 4;
};

// One page of k blocks dealt to the warps (kb on warp kb % 8), one token group: the megakernel's
// page loop at batch <= 8.
template <bool kUnrolled>
__device__ __forceinline__ void consume_page(float (&acc)[1][1][4], const uint8_t* page, int warp) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint8_t* xrow = page + Tile::kWBytes + g * Tile::kXPitch + t * 4;
#pragma unroll(kUnrolled ? Tile::kStageKB / kConsumerWarps : 1)
  for (int kb = warp; kb < Tile::kStageKB; kb += kConsumerWarps) {
    const uint32_t b0[1] = {*reinterpret_cast<const uint32_t*>(xrow + kb * 32)};
    const uint32_t b1[1] = {*reinterpret_cast<const uint32_t*>(xrow + kb * 32 + 16)};
    packed_mma_k16<1, 1>(acc, [&](int) { return page + kb * kPackTileBytes; }, b0, b1);
  }
}

__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory");
}

// CTA b streams `bytes_per_cta` bytes from src + b * region, wrapping inside its region; the pages
// are evict-first (the weight stream's policy) unless the region is re-read (keep_in_l2). With a
// GEMM consumer the page is the megakernel's batch-1 page: a 16 KB weight part and a 1 KB
// activation part, two bulk copies (expect_tx, then arrive.expect_tx), as the megakernel issues them.
__global__ void __launch_bounds__(kThreads, 1)
    stream_kernel(const uint8_t* src, size_t region, size_t bytes_per_cta, int page_bytes, int slots, int n_active,
                  bool keep_in_l2, int consumer, float* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kMaxSlots], empty[kMaxSlots];
  __shared__ float red[Tile::kRedBytes / 4];
  if (static_cast<int>(blockIdx.x) >= n_active) return;
  const bool gemm = consumer != kStreamTouch;
  const int n_consumer_warps = gemm ? kConsumerWarps : 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i) {
      ptx::mbar_init(&full[i], 1);
      ptx::mbar_init(&empty[i], n_consumer_warps);
    }
    ptx::fence_mbar_init();
  }
  __syncthreads();
  const uint32_t w_bytes = gemm ? static_cast<uint32_t>(Tile::kWBytes) : static_cast<uint32_t>(page_bytes);
  const uint32_t x_bytes = gemm ? static_cast<uint32_t>(Tile::kStageK * 2) : 0u;
  const uint8_t* base = src + static_cast<size_t>(blockIdx.x) * region;
  const int64_t n_pages = static_cast<int64_t>(bytes_per_cta / w_bytes);
  const int64_t pages_per_region = static_cast<int64_t>(region / w_bytes);
  if (warp == kConsumerWarps) {
    if (lane == 0) {
      const uint64_t policy = keep_in_l2 ? ptx::policy_evict_last() : ptx::policy_evict_first();
      for (int64_t i = 0; i < n_pages; ++i) {
        const int slot = static_cast<int>(i % slots);
        uint8_t* page = smem + static_cast<size_t>(slot) * page_bytes;
        if (i >= slots) ptx::mbar_wait(&empty[slot], static_cast<uint32_t>((i / slots - 1) & 1));
        const uint8_t* at = base + (i % pages_per_region) * w_bytes;
        if (!gemm) {
          ptx::mbar_arrive_expect_tx(&full[slot], w_bytes);
          ptx::bulk_g2s(page, at, w_bytes, &full[slot], policy);
          continue;
        }
        // The megakernel's order: weights first (expect_tx), then the activation row (arrive).
        asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(ptx::smem_addr(&full[slot])),
                     "r"(w_bytes)
                     : "memory");
        ptx::bulk_g2s(page, at, w_bytes, &full[slot], policy);
        ptx::mbar_arrive_expect_tx(&full[slot], x_bytes);
        ptx::bulk_g2s(page + Tile::kWBytes, base, x_bytes, &full[slot]);
      }
    }
    return;
  }
  if (warp >= n_consumer_warps) return;
  float acc[Tile::kMT][1][4] = {};
  float touch = 0.0f;
  for (int64_t i = 0; i < n_pages; ++i) {
    const int slot = static_cast<int>(i % slots);
    const uint8_t* page = smem + static_cast<size_t>(slot) * page_bytes;
    ptx::mbar_wait(&full[slot], static_cast<uint32_t>((i / slots) & 1));
    if (consumer == kStreamTouch || consumer == kStreamRelease) {
      touch += reinterpret_cast<const float*>(page)[lane];
    } else if (consumer == kStreamGemmUnrolled) {
      consume_page<true>(acc, page, warp);
    } else {
      consume_page<false>(acc, page, warp);
    }
    if (gemm && consumer != kStreamGemmNoFence) ptx::fence_proxy_async_shared();  // the megakernel's release of a page
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(&empty[slot]);
    // The megakernel's epilogue per 16-row block (4 pages at k = 2048): warp partials summed in
    // warp order through shared memory, 16 outputs stored.
    if (consumer == kStreamGemmReduce && i % 4 == 3) {
      consumers_sync();
      float* mine = red + warp * (8 * Tile::kRedPitch);
      const int g = lane >> 2, t4 = lane & 3;
      mine[(2 * t4) * Tile::kRedPitch + g] = acc[0][0][0];
      mine[(2 * t4 + 1) * Tile::kRedPitch + g] = acc[0][0][1];
      mine[(2 * t4) * Tile::kRedPitch + g + 8] = acc[0][0][2];
      mine[(2 * t4 + 1) * Tile::kRedPitch + g + 8] = acc[0][0][3];
      consumers_sync();
      const int tid = threadIdx.x;
      if (tid < 16) {
        float s = 0.0f;
        for (int w = 0; w < kConsumerWarps; ++w) s += red[w * (8 * Tile::kRedPitch) + tid];
        touch += s;
      }
      acc[0][0][0] = acc[0][0][1] = acc[0][0][2] = acc[0][0][3] = 0.0f;
    }
  }
  touch += acc[0][0][0] + acc[0][0][1] + acc[0][0][2] + acc[0][0][3];
  if (lane == 0) atomicAdd(&sink[blockIdx.x], touch);
}

}  // namespace

StreamResult measure_stream(const StreamShape& shape, int reps) {
  MD_REQUIRE(shape.slots >= 1 && shape.slots <= kMaxSlots, "stream: slots ", shape.slots, " outside 1..", kMaxSlots);
  const bool gemm = shape.consumer != kStreamTouch;
  const int page_bytes = gemm ? Tile::kPageBytes : shape.page_bytes;
  const size_t w_bytes = gemm ? Tile::kWBytes : static_cast<size_t>(page_bytes);
  MD_REQUIRE(page_bytes >= 1024 && page_bytes % 128 == 0, "stream: page of ", page_bytes, " bytes");
  MD_REQUIRE(shape.region_bytes % w_bytes == 0 && shape.bytes_per_sm % w_bytes == 0,
             "stream: region and bytes per SM must be whole pages");
  const int n_sms = sm_count();
  const int active = shape.n_sms <= 0 ? n_sms : std::min(shape.n_sms, n_sms);
  const size_t smem = static_cast<size_t>(shape.slots) * page_bytes;
  CUDA_CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  uint8_t* buf = nullptr;
  float* sink = nullptr;
  const size_t total = shape.region_bytes * static_cast<size_t>(active);
  CUDA_CHECK(cudaMalloc(&buf, total));
  CUDA_CHECK(cudaMemset(buf, 0x3c, total));
  CUDA_CHECK(cudaMalloc(&sink, n_sms * sizeof(float)));
  StreamResult r;
  r.ms = median_event_ms(nullptr, 1, reps, [&] {
    stream_kernel<<<n_sms, kThreads, smem>>>(buf, shape.region_bytes, shape.bytes_per_sm, page_bytes, shape.slots, active,
                                             shape.region_bytes < shape.bytes_per_sm, shape.consumer, sink);
    CUDA_CHECK_LAST();
  });
  CUDA_CHECK(cudaFree(sink));
  CUDA_CHECK(cudaFree(buf));
  r.gbps_total = static_cast<double>(shape.bytes_per_sm) * active / (r.ms * 1e-3) / 1e9;
  r.gbps_per_sm = r.gbps_total / active;
  r.n_sms = active;
  return r;
}

}  // namespace megadecode::cuda
