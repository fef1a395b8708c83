// Facts about the GPU, read from the device (never assumed).
#pragma once

#include <cstddef>
#include <string>

namespace megadecode::cuda {

struct DeviceInfo {
  std::string name;
  int n_sms = 0;
  int l2_bytes = 0;
  int smem_optin_bytes = 0;
  int cc_major = 0;
  int cc_minor = 0;
  size_t total_bytes = 0;
};

bool gpu_available();
DeviceInfo device_info(int device = 0);
// SMs of the current device (one attribute query: cheap enough for every launch path).
int sm_count();

}  // namespace megadecode::cuda
