// The pure-read bandwidth ceiling every decode number is quoted against (bandwidth.cu): the
// kernel, and the one measurement of it the benchmarks share (bench bandwidth, gemm, decode).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>
#include <nlohmann/json.hpp>

namespace megadecode::cuda {

// Reads [src, src + bytes) once with `blocks_per_sm` CTAs of `threads` threads, each thread keeping
// `unroll` 16-byte loads in flight; writes one word per CTA to sink[grid] so nothing is elided.
void read_bandwidth(const void* src, size_t bytes, int blocks_per_sm, int threads, int unroll, uint32_t* sink,
                    cudaStream_t stream);

// Best pure-read GB/s over a few launch shapes of read_bandwidth on a `bytes` buffer (allocated
// and freed here): per shape the median of `reps` timed launches after 2 untimed ones. One JSON
// record per shape is appended to `records`; with `print`, one line per shape on stdout.
double measure_read_ceiling(size_t bytes, int reps, nlohmann::json& records, bool print);

}  // namespace megadecode::cuda
