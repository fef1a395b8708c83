// CUDA_CHECK(expr): on failure prints the statement, the error string and file:line, then aborts.
// CUDA_CHECK_LAST(): the same for the last launch error.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CUDA_CHECK(expr)                                                                          \
  do {                                                                                            \
    cudaError_t md_err_ = (expr);                                                                 \
    if (md_err_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "CUDA error: %s failed: %s at %s:%d\n", #expr, cudaGetErrorString(md_err_), \
                   __FILE__, __LINE__);                                                           \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

#define CUDA_CHECK_LAST() CUDA_CHECK(cudaGetLastError())
