// The CUDA-event timing loop of the GPU benchmarks (event_timer.h).
#include "bench/gpu/event_timer.h"

#include <vector>

#include "core/check.h"
#include "core/stats.h"
#include "cuda/common/cuda_check.h"

namespace megadecode::cuda {

double median_event_ms(cudaStream_t stream, int warmup, int reps, const std::function<void()>& launch) {
  MD_REQUIRE(warmup >= 0 && reps >= 1, "median_event_ms: ", warmup, " warmup runs, ", reps, " timed runs");
  for (int i = 0; i < warmup; ++i) launch();
  cudaEvent_t a = nullptr, b = nullptr;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    launch();
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return median(ms);
}

}  // namespace megadecode::cuda
