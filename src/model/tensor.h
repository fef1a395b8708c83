// Tensor views over weight bytes (memory-mapped checkpoint files or owned buffers).
// A TensorView does not own its bytes; whoever made it (a Checkpoint, a TensorStore) keeps them alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"

namespace megadecode {

enum class Dtype { kBF16, kF16, kF32 };

inline size_t dtype_bytes(Dtype d) { return d == Dtype::kF32 ? 4 : 2; }
inline const char* dtype_name(Dtype d) { return d == Dtype::kBF16 ? "BF16" : d == Dtype::kF16 ? "F16" : "F32"; }

struct TensorView {
  std::string name;
  Dtype dtype = Dtype::kBF16;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // n_elements() * dtype_bytes(dtype) bytes, little-endian
  std::string file;                 // where it came from, for error messages

  int64_t n_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t n_bytes() const { return static_cast<size_t>(n_elements()) * dtype_bytes(dtype); }
  // Element i (row-major) converted to float.
  float at(int64_t i) const {
    switch (dtype) {
      case Dtype::kBF16: return bf16_bits_to_float(load_u16(i));
      case Dtype::kF16: return fp16_bits_to_float(load_u16(i));
      case Dtype::kF32: {
        float f;
        std::memcpy(&f, data + 4 * i, 4);
        return f;
      }
    }
    return 0.0f;
  }

 private:
  uint16_t load_u16(int64_t i) const {
    uint16_t v;
    std::memcpy(&v, data + 2 * i, 2);
    return v;
  }
};

using TensorMap = std::map<std::string, TensorView>;

// Owns tensors built in memory (tests, synthetic weights) and hands out views of them.
class TensorStore {
 public:
  // Adds a zero-filled tensor and returns its writable bytes.
  std::byte* add(const std::string& name, Dtype dtype, std::vector<int64_t> shape) {
    MD_CHECK(views_.count(name) == 0, "duplicate tensor ", name);
    TensorView v;
    v.name = name;
    v.dtype = dtype;
    v.shape = std::move(shape);
    v.file = "<memory>";
    auto buffer = std::make_unique<std::byte[]>(v.n_bytes());
    std::memset(buffer.get(), 0, v.n_bytes());
    v.data = buffer.get();
    std::byte* out = buffer.get();
    buffers_.push_back(std::move(buffer));
    views_[name] = std::move(v);
    return out;
  }
  const TensorMap& tensors() const { return views_; }

 private:
  std::vector<std::unique_ptr<std::byte[]>> buffers_;
  TensorMap views_;
};

}  // namespace megadecode
