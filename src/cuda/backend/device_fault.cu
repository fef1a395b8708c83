// device_fault_step_from_env, launch_illegal_address_write (see device_fault.h). Test only.
#include "cuda/backend/device_fault.h"

#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "cuda/common/cuda_check.h"

namespace megadecode::cuda {
namespace {

// `target` comes from the host, so the compiler cannot see (and drop) the bad store.
__global__ void illegal_address_write(int* target) { *reinterpret_cast<volatile int*>(target) = 1; }

}  // namespace

int device_fault_step_from_env() {
  const char* v = std::getenv("MEGADECODE_TEST_DEVICE_FAULT_STEP");
  if (v == nullptr || v[0] == '\0') return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  MD_REQUIRE(*end == '\0' && n >= 0 && n < (1L << 30), "MEGADECODE_TEST_DEVICE_FAULT_STEP=", v,
             ": expected a step number >= 0");
  return static_cast<int>(n);
}

void launch_illegal_address_write(cudaStream_t stream) {
  // In the null page, which the device never maps (a null dereference faults the same way).
  int* target = reinterpret_cast<int*>(uintptr_t{0x100});
  illegal_address_write<<<1, 1, 0, stream>>>(target);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda
