// The persistent decode megakernel: grid = SM count, one CTA per SM (all resident), 384 threads:
// warps 0..7 are the consumers (they walk the SM's task list: counter waits, activation prologues,
// the GEMM math from the page ring, attention items, epilogues, arrivals), warp 8 is the loader
// (loader.cuh: the same task list, streaming weight pages ahead of the consumers, and each layer's
// routing), warps 9..11 only complete the loader's warpgroup, which gives its registers to the
// consumers (sync.cuh kConsumerRegs). The two meet only at the ring's mbarriers and at each layer's
// routing (route_bar). One launch runs tasks [list_begin[s], list_end[s]) of every SM s: the whole
// step (cuda-mk) or one wave (cuda-ops).
// Shared memory: smem.cuh.
#pragma once

#include <cstdint>

#include "cuda/megakernel/attention_item.cuh"
#include "cuda/megakernel/loader.cuh"

namespace megadecode::cuda::mk {

template <int kNT>
__device__ void consumer_loop(ConsumerCtx<kNT>& c, int begin, int end, volatile int32_t* consumer_task) {
  const MkParams& p = c.p;
  const int tid = threadIdx.x;
  for (int i = begin; i < end; ++i) {
    const Task t = p.tasks[i];
    // (The previous task ended at a consumer barrier: its readers of the shared areas are done.)
    if (tid == 0) *consumer_task = i;
    TraceClock clock;  // the task's trace record (thread 0), written after its arrivals
    clock.start(p);
    bool ok;
    switch (op_form(static_cast<Op>(t.op))) {  // generated from MD_OPS (plan/op_table.h)
      case OpForm::kAttn:
        if ((t.flags & ~(kAttnNoRope | kAttnSliding)) != 0) {  // a flag this kernel does not know
          if (tid == 0) set_error(p, kMkBadShape, -1, t.op, t.flags, i, kMkDetailUnknownOp);
          ok = false;
          break;
        }
        ok = op_attn(p, t, i, *reinterpret_cast<AttnScratch*>(c.area));
        break;
      case OpForm::kSample:
        ok = wait_task(c, t, i, 0, t.n_waits) && op_sample(p, t.arg[0], t.arg[1], *reinterpret_cast<SampleScratch*>(c.area));
        break;
      case OpForm::kGemm: ok = op_gemm(c, t, i); break;
      case OpForm::kLogits:  // the LM head: the GEMM, and each token's LogitBest for SAMPLE
        lm_head_best_init(p, reinterpret_cast<LogitBest*>(c.combine()));
        ok = op_gemm(c, t, i);
        // Every thread, whatever its ok (a failed page wait is one thread's): it meets the others.
        lm_head_best(p, i, reinterpret_cast<const LogitBest*>(c.combine()));
        break;
      default:  // OpForm::kNone: not an op this kernel runs (megakernel_runs): stop, never run it as another op
        if (tid == 0) set_error(p, kMkBadShape, -1, t.op, kNumOps, i, kMkDetailUnknownOp);
        ok = false;
        break;
    }
    // Every thread's stores of this task are done, and a failure anywhere stops every thread.
    if (consumer_any(!ok)) return;
    if (tid == 0)
      for (int a = 0; a < t.n_arrives && a < kMaxArrives; ++a) {
        const Arrive ar = p.tasks[i].arrive[a];  // from the list: no indexed local copy
        arrive_counter(p, ar.counter, ar.amount);
      }
    clock.record(p, 0, kTraceWork, t, i, t.arg[0], t.arg[1], t.arg[2]);
  }
}

template <int kNT>
__global__ void __launch_bounds__(kThreads, 1) megakernel(const __grid_constant__ MkParams p, int n_slots) {
  using S = Smem<kNT>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBarOffset);
  uint64_t* empty = full + kMaxSlots;
  uint64_t* route_bar = empty + kMaxSlots;
  volatile int32_t* consumer_task = reinterpret_cast<volatile int32_t*>(route_bar + 1);
  RouteSmem& route = *reinterpret_cast<RouteSmem*>(smem + S::kRouteOffset);
  if (threadIdx.x == 0) {
    for (int i = 0; i < n_slots; ++i) {
      ptx::mbar_init(&full[i], 1);
      ptx::mbar_init(&empty[i], kConsumerWarps);
    }
    ptx::mbar_init(route_bar, 1);
    *consumer_task = -1;
    route.taken_layer = -1;
    route.taken = 0;
    ptx::fence_mbar_init();
  }
  __syncthreads();
  const Ring ring{smem + S::kRingOffset, n_slots, full, empty};
  const int sm = blockIdx.x;
  const int begin = p.list_begin[sm], end = p.list_end[sm];
  Loader<kNT> loader{p, ring, route, route_bar, consumer_task, ptx::policy_evict_first(), ptx::policy_evict_last()};
  if ((threadIdx.x >> 5) >= kLoaderWarp) {
    ptx::setmaxnreg_dec<kLoaderRegs>();
    if ((threadIdx.x >> 5) == kLoaderWarp) (void)loader.run(begin, end);  // lane 0 issues, every lane routes
  } else {
    ptx::setmaxnreg_inc<kConsumerRegs>();
    float* red0 = reinterpret_cast<float*>(smem + S::kRedOffset);
    float* red1 = S::kTwoRedBuffers ? reinterpret_cast<float*>(smem + S::kUnionOffset + S::kRed2Offset) : red0;
    ConsumerCtx<kNT> c{p, ring, RingPos{}, route, route_bar, RedBuffers{red0, red1}, smem + S::kUnionOffset,
                       reinterpret_cast<Fill*>(smem + S::kFillOffset)};
    consumer_loop<kNT>(c, begin, end, consumer_task);
  }
  // Both sides stopped. After a failure the consumers may have left pages unconsumed: let every
  // copy in flight land before the CTA exits.
  __syncthreads();
  if (threadIdx.x == kLoaderWarp * 32 && step_failed(p)) loader.drain();
}

}  // namespace megadecode::cuda::mk
