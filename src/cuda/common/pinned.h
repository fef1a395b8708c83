// PinnedBuffer: page-locked host memory that grows on demand. Copies between it and the device are
// asynchronous on a stream (from pageable memory the driver may wait for the stream first, which
// an overlapped step cannot afford). Growing drops the old contents; the caller knows that no copy
// from or into the old buffer is still pending.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/common/cuda_check.h"

namespace megadecode::cuda {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { CUDA_CHECK_NOTHROW(cudaFreeHost(data_)); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least `bytes` bytes (grown by half again when it must grow); returns the buffer.
  uint8_t* reserve(size_t bytes) {
    if (bytes > bytes_) {
      CUDA_CHECK(cudaFreeHost(data_));
      data_ = nullptr;
      bytes_ = 0;
      const size_t grown = bytes + bytes / 2;
      CUDA_CHECK(cudaMallocHost(&data_, grown));
      bytes_ = grown;
    }
    return static_cast<uint8_t*>(data_);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace megadecode::cuda
