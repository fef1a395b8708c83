// MD_HOST_DEVICE marks a function that host and device code both compile (plain C++ without nvcc).
#pragma once

#if defined(__CUDACC__)
#define MD_HOST_DEVICE __host__ __device__
#else
#define MD_HOST_DEVICE
#endif
