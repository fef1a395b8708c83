// The pure-read bandwidth kernel (bandwidth.cu): the ceiling every decode number is quoted against.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace megadecode::cuda {

// Reads [src, src + bytes) once with `blocks_per_sm` CTAs of `threads` threads, each thread keeping
// `unroll` 16-byte loads in flight; writes one word per CTA to sink[grid] so nothing is elided.
void read_bandwidth(const void* src, size_t bytes, int blocks_per_sm, int threads, int unroll, uint32_t* sink,
                    cudaStream_t stream);

}  // namespace megadecode::cuda
