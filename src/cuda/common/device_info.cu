// Queries the GPU the CUDA backends will run on.
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_info.h"

namespace megadecode::cuda {

bool gpu_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

DeviceInfo device_info(int device) {
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceInfo info;
  info.name = p.name;
  info.n_sms = p.multiProcessorCount;
  info.l2_bytes = p.l2CacheSize;
  info.smem_optin_bytes = static_cast<int>(p.sharedMemPerBlockOptin);
  info.cc_major = p.major;
  info.cc_minor = p.minor;
  info.total_bytes = p.totalGlobalMem;
  return info;
}

int sm_count() {
  int dev = 0, n_sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, dev));
  return n_sms;
}

}  // namespace megadecode::cuda
