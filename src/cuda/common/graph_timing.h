// time_graph_replays: a captured step replayed `warmup` + `reps` times, CUDA events around each
// graph launch; `check` runs after every replay (the step's device error word: it throws) and the
// milliseconds of the timed replays come back. The benchmarks' timing of the megakernel and the
// batched step (their probes' time_last_step).
#pragma once

#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/common/cuda_check.h"

namespace megadecode::cuda {

template <class Check>
std::vector<float> time_graph_replays(cudaGraphExec_t exec, int warmup, int reps, cudaStream_t stream, Check&& check) {
  struct Events {  // destroyed on every path, a throwing check included
    cudaEvent_t a = nullptr, b = nullptr;
    ~Events() {
      if (a) CUDA_CHECK_NOTHROW(cudaEventDestroy(a));
      if (b) CUDA_CHECK_NOTHROW(cudaEventDestroy(b));
    }
  } e;
  CUDA_CHECK(cudaEventCreate(&e.a));
  CUDA_CHECK(cudaEventCreate(&e.b));
  std::vector<float> ms;
  ms.reserve(reps);
  for (int i = 0; i < warmup + reps; ++i) {
    CUDA_CHECK(cudaEventRecord(e.a, stream));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaEventRecord(e.b, stream));
    CUDA_CHECK(cudaEventSynchronize(e.b));
    check();
    float t = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&t, e.a, e.b));
    if (i >= warmup) ms.push_back(t);
  }
  return ms;
}

}  // namespace megadecode::cuda
