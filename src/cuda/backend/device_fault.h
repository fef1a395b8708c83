// Test only: a device fault on demand, so the GPU tests can check the whole failure path (the
// step's CUDA_CHECK throws a sticky DeviceError, the engine ends every request with an error,
// `serve` exits 1). Not reachable in normal use: nothing happens unless the environment variable
// MEGADECODE_TEST_DEVICE_FAULT_STEP is set (test_serve_device_fault_gpu sets it for the child
// `megadecode serve` it starts); the backend then logs a warning at start-up.
#pragma once

#include <cuda_runtime.h>

namespace megadecode::cuda {

// MEGADECODE_TEST_DEVICE_FAULT_STEP=N: the decode step N (0 = the first) faults; -1 when unset.
// Error when set to anything but a number >= 0.
int device_fault_step_from_env();

// Launches, on `stream`, a one-thread kernel that writes to an unmapped address: the next
// synchronisation fails with cudaErrorIllegalAddress, and the context is lost (sticky).
void launch_illegal_address_write(cudaStream_t stream);

}  // namespace megadecode::cuda
