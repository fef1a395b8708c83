// The megakernel's page-ring handshake on its own, with every page checked: one loader thread refills
// a ring of 4 shared-memory slots with cp.async.bulk (each page filled with its own sequence number),
// 8 consumer warps wait on the slot's full barrier, read every word of the page, check it, then
// fence.proxy.async.shared::cta and arrive on the slot's empty barrier, which the loader waits on
// before the next bulk copy into that slot. The order (generic reads -> proxy fence -> mbarrier
// release -> mbarrier acquire -> async-proxy write) is the one the megakernel relies on; a page
// overwritten before its readers finished would show as a wrong word. compute-sanitizer racecheck
// nevertheless reports this kernel's reads against the bulk copies (it does not follow the order
// through the mbarrier into the async proxy): scripts/gpu's sanitize part runs it under racecheck to
// show that report on provably ordered code, and classes the megakernel's reports of the same
// pattern (and only those) with it.
// The second probe is the routing handoff: the loader warp writes a table (the layer's routing),
// lane 0 arrives on an mbarrier the 256 consumer threads wait on; they read and check every entry,
// meet at their named barrier, and thread 0 arrives on a second mbarrier the loader warp waits on
// before it writes the next round. Ordered both ways through mbarriers only (in the megakernel the
// second way runs through the step's counters: the router tiles the loader waits on come after
// every SM's last routed task of the previous layer), which racecheck does not follow either: its
// reports here are the pattern of the megakernel's routing tables (written by compute_routing in
// the loader warp, read by the consumers' job walk, row maps and epilogues).
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/common/ptx.cuh"
#include "../gpu_test_util.h"

namespace megadecode::test {
namespace {

constexpr int kSlots = 4;
constexpr int kPageWords = 1024;  // 4 KB pages
constexpr int kPages = 64;

__global__ void ring_probe(const uint32_t* src, uint32_t* bad) {
  __shared__ __align__(128) uint32_t pages[kSlots][kPageWords];
  __shared__ __align__(8) uint64_t full[kSlots], empty[kSlots];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kSlots; ++i) {
      cuda::ptx::mbar_init(&full[i], 1);
      cuda::ptx::mbar_init(&empty[i], 8);
    }
    cuda::ptx::fence_mbar_init();
  }
  __syncthreads();
  if (warp == 8) {
    if (lane == 0)
      for (int p = 0; p < kPages; ++p) {
        const int slot = p % kSlots;
        if (p >= kSlots) cuda::ptx::mbar_wait(&empty[slot], ((p / kSlots) - 1) & 1);
        cuda::ptx::mbar_arrive_expect_tx(&full[slot], kPageWords * 4);
        cuda::ptx::bulk_g2s(pages[slot], src + static_cast<int64_t>(p) * kPageWords, kPageWords * 4, &full[slot]);
      }
    return;
  }
  uint32_t wrong = 0;
  for (int p = 0; p < kPages; ++p) {
    const int slot = p % kSlots;
    cuda::ptx::mbar_wait(&full[slot], (p / kSlots) & 1);
    for (int i = threadIdx.x; i < kPageWords; i += 256) wrong += pages[slot][i] != static_cast<uint32_t>(p * 7919 + i);
    cuda::ptx::fence_proxy_async_shared();
    __syncwarp();
    if (lane == 0) cuda::ptx::mbar_arrive(&empty[slot]);
  }
  atomicAdd(bad, wrong);
}

constexpr int kTableWords = 512;
constexpr int kRounds = 16;

__global__ void table_probe(uint32_t* bad) {
  __shared__ uint32_t table[kTableWords];
  __shared__ __align__(8) uint64_t ready, done;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    cuda::ptx::mbar_init(&ready, 1);
    cuda::ptx::mbar_init(&done, 1);
    cuda::ptx::fence_mbar_init();
  }
  __syncthreads();
  if (warp == 8) {  // the loader warp writes each round's table
    for (int r = 0; r < kRounds; ++r) {
      if (r > 0) cuda::ptx::mbar_wait(&done, (r - 1) & 1);
      for (int i = lane; i < kTableWords; i += 32) table[i] = static_cast<uint32_t>(r * 131 + i);
      __syncwarp();
      if (lane == 0) cuda::ptx::mbar_arrive(&ready);
    }
    return;
  }
  uint32_t wrong = 0;
  for (int r = 0; r < kRounds; ++r) {
    cuda::ptx::mbar_wait(&ready, r & 1);
    for (int i = threadIdx.x; i < kTableWords; i += 256) wrong += table[i] != static_cast<uint32_t>(r * 131 + i);
    asm volatile("bar.sync 1, 256;" ::: "memory");
    if (threadIdx.x == 0) cuda::ptx::mbar_arrive(&done);
  }
  atomicAdd(bad, wrong);
}

TEST(RacecheckProbe, RoutingTablesHandedOverThroughMbarriers) {
  MD_REQUIRE_GPU();
  DeviceBuffer<uint32_t> bad(1);
  bad.fill_bytes(0);
  table_probe<<<1, 288>>>(bad.get());
  CUDA_CHECK_LAST();
  EXPECT_EQ(bad.download()[0], 0u) << "a consumer read a table entry of the wrong round";
}

TEST(RacecheckProbe, PageRingReadsEveryPageBeforeItsRefill) {
  MD_REQUIRE_GPU();
  std::vector<uint32_t> host(static_cast<size_t>(kPages) * kPageWords);
  for (int p = 0; p < kPages; ++p)
    for (int i = 0; i < kPageWords; ++i) host[static_cast<size_t>(p) * kPageWords + i] = static_cast<uint32_t>(p * 7919 + i);
  DeviceBuffer<uint32_t> src(host), bad(1);
  bad.fill_bytes(0);
  ring_probe<<<1, 288>>>(src.get(), bad.get());
  CUDA_CHECK_LAST();
  EXPECT_EQ(bad.download()[0], 0u) << "a page was overwritten before its readers were done";
}

}  // namespace
}  // namespace megadecode::test
