// MD_HOST_DEVICE marks a function that host and device code both compile (plain C++ without nvcc);
// MD_UNROLL asks the device compiler to unroll the loop that follows (register arrays indexed by
// its counter stay in registers) and is nothing to a host compiler.
#pragma once

#if defined(__CUDACC__)
#define MD_HOST_DEVICE __host__ __device__
#else
#define MD_HOST_DEVICE
#endif

#if defined(__CUDA_ARCH__)
#define MD_UNROLL _Pragma("unroll")
#else
#define MD_UNROLL
#endif
