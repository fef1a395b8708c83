// The layout of a device workspace carved into 256-byte aligned buffers, walked twice: once with no
// base to measure it (workspace_bytes), once over the allocation to hand out the views, so the two
// can never drift. Host code; the prefill runner and the batched step carve theirs with it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megadecode::cuda {

class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(uint8_t* base) : base_(base) {}
  // The next buffer of n elements of T (nullptr while measuring).
  template <typename T>
  T* take(int64_t n) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + off_) : nullptr;
    off_ += (static_cast<size_t>(n) * sizeof(T) + 255) / 256 * 256;
    return p;
  }
  size_t bytes() const { return off_; }

 private:
  uint8_t* base_;
  size_t off_ = 0;
};

}  // namespace megadecode::cuda
