// CUDA_CHECK(expr): on failure throws megadecode::DeviceError (core/device_error.h) naming the
// statement, the error, file:line and whether it is sticky; the engine's backend-failure path takes
// it from there (engine/backend_guard.h). CUDA_CHECK_LAST(): the same for the last launch error.
// CUDA_CHECK_NOTHROW(expr): for destructors (and other places that must not throw): logs the
// failure and goes on.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "core/device_error.h"
#include "core/log.h"

namespace megadecode::cuda {

// Errors after which the context is unusable: every later call of the process fails the same way
// (the CUDA runtime's documentation of each says the process must be restarted).
inline bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
      return true;
    default:
      return false;
  }
}

inline DeviceError device_error(cudaError_t e, const char* expr, const char* file, int line) {
  return DeviceError(static_cast<int>(e), cudaGetErrorName(e), cudaGetErrorString(e), expr, file, line, is_sticky(e));
}

[[noreturn]] inline void throw_device_error(cudaError_t e, const char* expr, const char* file, int line) {
  throw device_error(e, expr, file, line);
}

inline void log_device_error(cudaError_t e, const char* expr, const char* file, int line) noexcept {
  try {
    log_error(device_error(e, expr, file, line).what());
  } catch (...) {  // logging must not throw out of a destructor
  }
}

}  // namespace megadecode::cuda

#define CUDA_CHECK(expr)                                                            \
  do {                                                                              \
    const cudaError_t md_err_ = (expr);                                             \
    if (md_err_ != cudaSuccess)                                                     \
      ::megadecode::cuda::throw_device_error(md_err_, #expr, __FILE__, __LINE__);   \
  } while (0)

#define CUDA_CHECK_NOTHROW(expr)                                                    \
  do {                                                                              \
    const cudaError_t md_err_ = (expr);                                             \
    if (md_err_ != cudaSuccess)                                                     \
      ::megadecode::cuda::log_device_error(md_err_, #expr, __FILE__, __LINE__);     \
  } while (0)

#define CUDA_CHECK_LAST() CUDA_CHECK(cudaGetLastError())
