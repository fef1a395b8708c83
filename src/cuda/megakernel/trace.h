// Per-SM trace of one megakernel launch (bench decode --trace): POD records shared by the kernel
// and the host, plus the device-side writer. Consumer thread 0 writes two arrays per SM (no
// atomics): role 0, one record per task (from the consumers' start of it to its arrivals); role 1,
// the parts of a task: each counter wait that had to poll, and each phase (TracePhase) — a wait for
// a weight page that had not landed, an activation fill, the consumers' wait for the routing, the
// attention prologue and split merge, an expert down share's combines. Parts nest inside their
// task's record. The loader warp's lane 0 writes role 2: its waits that blocked and its routing
// (LoaderPhase), each naming the task its walk was at.
// Timestamps: both %globaltimer (ns, comparable across SMs, possibly coarse) and clock64 (SM
// cycles, fine, per-SM origin); the host maps clock64 onto globaltimer per SM by least squares
// (bench/decode_trace.cpp). Tracing costs nothing when MkParams::trace is null: every hook is one
// pointer test per Work or per wait, outside the GEMM and attention loops.
#pragma once

#include <cstdint>

namespace megadecode {

enum TraceKind : int32_t {
  kTraceWork = 0,   // a task
  kTraceWait = 1,   // a counter wait inside a task that had to poll
  kTracePhase = 2,  // a phase of a task (arg0: TracePhase)
  kTraceLoader = 3, // the loader warp (role 2) at a task of its walk (arg0: LoaderPhase)
};
enum TracePhase : int32_t {
  kPhasePage = 0,        // the consumers waited for a weight page to land in the ring
  kPhaseFill = 1,        // an activation window fill (RMSNorm scales and rows, or a row copy)
  kPhaseRouting = 2,     // the layer's routing tables computed on the SM
  kPhaseAttnPrologue = 3,  // attention item: q/k norm, RoPE, append, q terms
  kPhaseAttnMerge = 4,   // attention item: the warps' merge, the publish, the split merge
  kPhaseCombine = 5,     // expert down: a row block's top-k combine with the residual
  kNumTracePhases = 6,
};
// What the loader warp's lane 0 records (role 2): where its walk waited, and its routing.
enum LoaderPhase : int32_t {
  kLoaderRouterWait = 0,  // the wait for the layer's router tiles before its routing (when it polled)
  kLoaderRouting = 1,     // the routing tables computed (routing.cuh compute_routing)
  kLoaderSlotWait = 2,    // a wait for a free ring slot or, under the loader's cap, for a page to land
  kNumLoaderPhases = 3,
};
inline constexpr int kTraceRoles = 3;

// One interval. Buffer layout: records[(sm * kTraceRoles + role) * capacity + i], i < count;
// counts[sm * kTraceRoles + role] keeps counting past the capacity (the host reports the drops).
struct TraceRecord {
  int64_t g_begin, g_end;  // %globaltimer, ns
  int64_t c_begin, c_end;  // clock64, SM cycles
  int32_t kind;            // TraceKind
  int32_t op;              // Op of the task (the work's op; for waits the waiting task's op)
  int32_t layer;           // -1 after the last layer
  int32_t task;            // plan task index (-1: none)
  int32_t arg0;            // task: arg[0] (attention: item index); wait: counter; phase: TracePhase
  int32_t arg1;            // task: arg[1];                         wait: target
  int32_t arg2;            // task: arg[2];                         wait: value seen first
  int32_t sm;              // the CTA (written by trace_put)
};
static_assert(sizeof(TraceRecord) == 64, "TraceRecord must stay one 64-byte record");

}  // namespace megadecode

#if defined(__CUDACC__)
namespace megadecode::cuda::mk {

__device__ __forceinline__ int64_t trace_clock() { return clock64(); }

__device__ __forceinline__ int64_t trace_gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return static_cast<int64_t>(t);
}

// Appends one record for this CTA's `role`. One thread per role calls it.
__device__ __forceinline__ void trace_put(TraceRecord* records, int32_t* counts, int32_t capacity, int role,
                                          TraceRecord r) {
  r.sm = static_cast<int32_t>(blockIdx.x);
  int32_t* count = counts + blockIdx.x * kTraceRoles + role;
  const int32_t n = *count;
  *count = n + 1;
  if (n < capacity) records[(static_cast<int64_t>(blockIdx.x) * kTraceRoles + role) * capacity + n] = r;
}

}  // namespace megadecode::cuda::mk
#endif
