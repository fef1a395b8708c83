// Synchronisation primitives of the megakernel beyond cuda/common/ptx.cuh: cross-CTA counter waits
// and arrivals (DESIGN.md §5 memory ordering), bounded in-CTA mbarrier waits, the device error
// record and the consumers' named barrier.
//
// Ordering recipe used everywhere:
//   producer of data: all writers store; consumer barrier; ONE thread red.release.gpu.add
//     (arrive_counter): release at gpu scope, cumulative over what the barrier made it observe.
//   consumer of data: ONE thread polls with ld.acquire.gpu (wait_counter), then the consumer
//     barrier hands the acquired data to the other threads; before a bulk copy (async proxy) reads
//     it, fence.proxy.async.global.
// Every wait is bounded (MkParams::timeout_ns, or the step failing elsewhere): a timeout writes the
// device error word and every SM leaves the step.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/megakernel/types.h"

namespace megadecode::cuda::mk {

constexpr int kConsumerWarps = 8;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kLoaderWarp = kConsumerWarps;  // warp 8, lane 0 is the loader
constexpr int kThreads = kConsumerThreads + 128;  // the loader's warpgroup: warp 8 and three idle warps
// Registers a thread after the start (setmaxnreg): the launch gives 168 to each of the 384 threads
// (64,512); the loader's warpgroup keeps 56 and the consumers take 224 (2 x 128 x 224 + 128 x 56 =
// 64,512). With 288 threads at 168 the kernel spilled 56-346 bytes a thread (kNT = 1..8).
constexpr int kConsumerRegs = 224;
constexpr int kLoaderRegs = 56;
static_assert(2 * 128 * kConsumerRegs + 128 * kLoaderRegs <= 384 * 168);
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

__device__ __forceinline__ int32_t ld_acquire_gpu(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int32_t ld_relaxed_gpu(const int32_t* p) {
  int32_t v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_gpu_add(int32_t* p, int32_t v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int32_t atom_add_acq_rel_gpu(int32_t* p, int32_t v) {
  int32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

__device__ __forceinline__ int32_t* counter_ptr(const MkParams& p, int32_t index) {
  return reinterpret_cast<int32_t*>(p.counters + static_cast<int64_t>(index) * p.plan.counters.stride_bytes);
}

// The step has failed somewhere (any SM): everyone stops waiting and leaves.
__device__ __forceinline__ bool step_failed(const MkParams& p) { return ld_relaxed_gpu(&p.error->code) != kMkOk; }

// Records the first failure of the step in `e`. Only the first writer's fields stick. Out of line:
// a cold path called from many places.
__device__ __noinline__ void record_error(MkError* e, int32_t code, int32_t counter, int32_t value, int32_t target,
                                          int32_t task, int32_t detail) {
  if (atomicCAS(&e->code, 0, -1) == 0) {
    e->counter = counter;
    e->value = value;
    e->target = target;
    e->sm = static_cast<int32_t>(blockIdx.x);
    e->task = task;
    e->detail = detail;
    __threadfence();
    atomicExch(&e->code, code);
  }
}
__device__ __forceinline__ void set_error(const MkParams& p, int32_t code, int32_t counter, int32_t value,
                                          int32_t target, int32_t task, int32_t detail) {
  record_error(p.error, code, counter, value, target, task, detail);
}

// Bounded poll of counter >= target by ONE thread with ld.acquire.gpu: spinning (or, with
// kMkPollBackoff, backing off 32 -> 256 ns). false: the step failed (a timeout here, recorded in
// the error word, or another SM's failure). `first_seen` (trace) gets the value of the first poll.
__device__ inline bool wait_counter(const MkParams& p, int32_t counter, int32_t target, int32_t task,
                                       int32_t* first_seen = nullptr) {
  const int32_t* c = counter_ptr(p, counter);
  int32_t v = ld_acquire_gpu(c);
  if (first_seen) *first_seen = v;
  if (v >= target) return true;
  const bool backoff = (p.flags & kMkPollBackoff) != 0;
  const int64_t t0 = globaltimer_ns();
  uint32_t sleep_ns = 32;
  for (uint32_t spin = 0;; ++spin) {
    if (backoff) {
      __nanosleep(sleep_ns);
      sleep_ns = sleep_ns < 256 ? sleep_ns * 2 : 256;
    }
    v = ld_acquire_gpu(c);
    if (v >= target) return true;
    if ((spin & 63) == 63) {
      if (step_failed(p)) return false;
      if (globaltimer_ns() - t0 > p.timeout_ns) {
        set_error(p, kMkWaitTimeout, counter, v, target, task, -1);
        return false;
      }
    }
  }
}

// The loader's wait (one thread) for a counter the consumers' work does not need yet: it may last
// the whole of an attention item, so it polls with relaxed loads and backs off (an acquire poll
// invalidates the SM's L1 under the consumers' loads each time), then acquires once. false: the
// step failed (a timeout here, recorded in the error word, or another SM's failure).
__device__ inline bool wait_counter_quiet(const MkParams& p, int32_t counter, int32_t target, int32_t task) {
  const int32_t* c = counter_ptr(p, counter);
  const int64_t t0 = globaltimer_ns();
  for (uint32_t spin = 0; ld_relaxed_gpu(c) < target; ++spin) {
    __nanosleep(128);
    if ((spin & 15) == 15) {
      if (step_failed(p)) return false;
      if (globaltimer_ns() - t0 > p.timeout_ns) {
        set_error(p, kMkWaitTimeout, counter, ld_relaxed_gpu(c), target, task, -3);
        return false;
      }
    }
  }
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
  return true;
}

// ---- trace hooks (trace.h; consumer thread 0, nothing when tracing is off) ----

// Times one interval of task `task` for the trace: start(), then record() (role 0: the task itself;
// role 1: a counter wait or a phase inside it), from the start to now.
struct TraceClock {
  int64_t g0 = 0, c0 = 0;
  bool on = false;
  __device__ __forceinline__ void start(const MkParams& p, bool when = true) { start_in(p, 0, when); }
  // The loader warp's clock (its lane 0 records role 2).
  __device__ __forceinline__ void start_loader(const MkParams& p, bool when = true) {
    start_in(p, kLoaderWarp * 32, when);
  }
  __device__ __forceinline__ void start_in(const MkParams& p, int thread, bool when) {
    on = p.trace != nullptr && static_cast<int>(threadIdx.x) == thread && when;
    if (on) {
      g0 = trace_gtime();
      c0 = trace_clock();
    }
  }
  __device__ __forceinline__ void stop_loader(const MkParams& p, const Task& t, int task, int phase) const {
    record(p, 2, kTraceLoader, t, task, phase);
  }
  __device__ __forceinline__ void record(const MkParams& p, int role, int32_t kind, const Task& t, int task, int32_t a0,
                                         int32_t a1 = 0, int32_t a2 = 0) const {
    if (!on) return;
    TraceRecord r{};
    r.g_begin = g0;
    r.c_begin = c0;
    r.c_end = trace_clock();
    r.g_end = trace_gtime();
    r.kind = kind;
    r.op = t.op;
    r.layer = t.layer;
    r.task = task;
    r.arg0 = a0;
    r.arg1 = a1;
    r.arg2 = a2;
    trace_put(p.trace, p.trace_counts, p.trace_capacity, role, r);
  }
  __device__ __forceinline__ void stop(const MkParams& p, const Task& t, int task, int phase) const {
    record(p, 1, kTracePhase, t, task, phase);
  }
};

// Thread 0 waits on waits [first, last) of task `t` (a trace record for each that had to poll);
// the other threads return true. Callers make the result uniform (consumer_any).
__device__ inline bool wait_counters(const MkParams& p, const Task& t, int task, int first, int last) {
  if (threadIdx.x != 0) return true;
  for (int i = first; i < last; ++i) {
    // From the task list itself: a dynamically indexed copy of the task would live in local memory.
    const Wait wt = p.tasks[task].wait[i];
    int32_t seen = 0;
    TraceClock clock;
    clock.start(p);
    if (!wait_counter(p, wt.counter, wt.target, task, &seen)) return false;
    if (seen < wt.target) clock.record(p, 1, kTraceWait, t, task, wt.counter, wt.target, seen);
  }
  return true;
}

// One thread, after a consumer barrier over every thread that wrote the data being published.
__device__ __forceinline__ void arrive_counter(const MkParams& p, int32_t counter, int32_t amount) {
  red_release_gpu_add(counter_ptr(p, counter), amount);
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

namespace megadecode::cuda::mk {

// A buffer of the step's arena (plan/task.h BufferLayout).
template <typename T>
__device__ __forceinline__ T* buf(const MkParams& p, const BufferSpan& s) {
  return reinterpret_cast<T*>(p.arena + s.offset);
}

}  // namespace megadecode::cuda::mk
