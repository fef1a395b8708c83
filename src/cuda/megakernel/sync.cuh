// Synchronisation primitives of the megakernel beyond cuda/common/ptx.cuh: cross-CTA counter polls
// and arrivals (DESIGN.md §5 memory ordering), bounded in-CTA mbarrier waits, the device error
// record and consumer-only named barriers.
//
// Ordering recipe used everywhere:
//   producer of data: all writers store; named barrier over the writers; ONE thread does
//     fence.acq_rel.gpu then red.relaxed.gpu.add (mk_arrive).
//   consumer of data: one thread polls with ld.relaxed.gpu + __nanosleep backoff, then ONE
//     fence.acquire.gpu (mk_wait_counter); the data is then handed to other threads through an
//     mbarrier (release/acquire at CTA scope) or a named barrier; before a bulk copy (async proxy)
//     reads it, fence.proxy.async.global.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/megakernel/types.h"

namespace megadecode::cuda::mk {

constexpr int kConsumerWarps = 8;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kProducerWarp = kConsumerWarps;  // warp 8, lane 0 is the producer
constexpr int kThreads = kConsumerThreads + 32;
constexpr int kConsumerBar = 1;  // named barrier of the 256 consumer threads (0 is __syncthreads)

__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync %0, %1;" ::"r"(kConsumerBar), "r"(kConsumerThreads) : "memory");
}

// OR of `pred` over the 256 consumer threads (a named barrier with reduction): keeps decisions
// that depend on per-thread failures uniform, so every thread passes the same barriers.
__device__ __forceinline__ bool consumer_any(bool pred) {
  uint32_t out;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred p, %2, %3, p;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(out)
      : "r"(static_cast<uint32_t>(pred)), "r"(kConsumerBar), "r"(kConsumerThreads)
      : "memory");
  return out != 0;
}

__device__ __forceinline__ int64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return static_cast<int64_t>(t);
}

__device__ __forceinline__ int32_t ld_relaxed_gpu(const int32_t* p) {
  int32_t v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void fence_acquire_gpu() { asm volatile("fence.acquire.gpu;" ::: "memory"); }
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ void red_relaxed_gpu_add(int32_t* p, int32_t v) {
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int32_t atom_add_acq_rel_gpu(int32_t* p, int32_t v) {
  int32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
// Queue claims: the returned index only selects work, the item data is host-written before the
// launch or published by DISPATCH before dispatch_done (acquired by the claimer's wait), so a
// relaxed atomic is enough.
__device__ __forceinline__ int32_t atom_add_relaxed_gpu(int32_t* p, int32_t v) {
  int32_t old;
  asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

__device__ __forceinline__ int32_t* counter_ptr(const MkParams& p, int32_t index) {
  return reinterpret_cast<int32_t*>(p.counters + static_cast<int64_t>(index) * p.plan.counters.stride_bytes);
}

// The step has failed somewhere (any SM): everyone stops waiting and leaves.
__device__ __forceinline__ bool step_failed(const MkParams& p) { return ld_relaxed_gpu(&p.error->code) != kMkOk; }

// Records the first failure of the step. Only the first writer's fields stick.
__device__ inline void set_error(const MkParams& p, int32_t code, int32_t counter, int32_t value, int32_t target,
                                 int32_t task, int32_t detail) {
  if (atomicCAS(&p.error->code, 0, -1) == 0) {
    p.error->counter = counter;
    p.error->value = value;
    p.error->target = target;
    p.error->sm = static_cast<int32_t>(blockIdx.x);
    p.error->task = task;
    p.error->detail = detail;
    __threadfence();
    atomicExch(&p.error->code, code);
  }
}

// Bounded poll of counter >= target by ONE thread, then fence.acquire.gpu. false: the step failed
// (timeout here, recorded in the error word, or another SM's failure).
__device__ inline bool mk_wait_counter(const MkParams& p, int32_t counter, int32_t target, int32_t task) {
  const int32_t* c = counter_ptr(p, counter);
  int32_t v = ld_relaxed_gpu(c);
  if (v < target) {
    const int64_t t0 = globaltimer_ns();
    uint32_t sleep_ns = 32;
    for (uint32_t spin = 0;; ++spin) {
      __nanosleep(sleep_ns);
      sleep_ns = sleep_ns < 256 ? sleep_ns * 2 : 256;
      v = ld_relaxed_gpu(c);
      if (v >= target) break;
      if ((spin & 15) == 15) {
        if (step_failed(p)) return false;
        if (globaltimer_ns() - t0 > p.timeout_ns) {
          set_error(p, kMkWaitTimeout, counter, v, target, task, -1);
          return false;
        }
      }
    }
  }
  fence_acquire_gpu();
  return true;
}

// Non-blocking check (for the producer's prefetch loop); acquires when satisfied.
__device__ __forceinline__ bool mk_counter_ready(const MkParams& p, int32_t counter, int32_t target) {
  if (ld_relaxed_gpu(counter_ptr(p, counter)) < target) return false;
  fence_acquire_gpu();
  return true;
}

// One thread, after a barrier over every thread that wrote the data being published.
__device__ __forceinline__ void mk_arrive(const MkParams& p, int32_t counter, int32_t amount) {
  fence_acq_rel_gpu();
  red_relaxed_gpu_add(counter_ptr(p, counter), amount);
}

// ---- mbarriers (CTA scope) ----
__device__ __forceinline__ bool mbar_test_wait(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(ok)
      : "r"(ptx::smem_addr(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}
// Adds to the phase's expected transaction bytes without arriving (the weight part of a page is
// expected before its activation part; the arrive comes with the activation part).
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(ptx::smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Bounded wait for the phase of `parity`. The bound is generous (the other side may itself be
// waiting up to timeout_ns on a counter); false after recording kMkBarrierTimeout.
__device__ inline bool mbar_wait_bounded(const MkParams& p, uint64_t* bar, uint32_t parity, int32_t detail) {
  if (ptx::mbar_try_wait(bar, parity)) return true;
  const int64_t t0 = globaltimer_ns();
  for (uint32_t spin = 0;; ++spin) {
    if (ptx::mbar_try_wait(bar, parity)) return true;
    if ((spin & 63) == 63) {
      if (step_failed(p)) return false;
      if (globaltimer_ns() - t0 > 3 * p.timeout_ns + 1000000000ll) {
        set_error(p, kMkBarrierTimeout, -1, 0, 0, -1, detail);
        return false;
      }
    }
  }
}

}  // namespace megadecode::cuda::mk
