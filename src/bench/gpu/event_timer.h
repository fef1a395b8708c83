// GPU work timed on the device's own clock, the one loop every GPU benchmark times with: CUDA
// events recorded around each run on the work's stream, the median over the runs.
#pragma once

#include <functional>

#include <cuda_runtime_api.h>

namespace megadecode::cuda {

// Runs launch() `warmup` times untimed, then `reps` times, each between two events recorded on
// `stream` (launch() enqueues its work on `stream`); returns the median milliseconds of a run.
double median_event_ms(cudaStream_t stream, int warmup, int reps, const std::function<void()>& launch);

}  // namespace megadecode::cuda
