// Helpers shared by the safetensors tests: building file bytes, catching error messages, temporary
// directories, and checking that parsed views lie inside the buffer.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/check.h"
#include "core/rng.h"
#include "model/safetensors.h"

namespace megadecode::st_test {

// u64 little-endian length, header text, data section of `data_bytes` bytes (pattern-filled).
inline std::vector<std::byte> safetensors_bytes(const std::string& header, size_t data_bytes) {
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) out[8 + header.size() + i] = static_cast<std::byte>(i * 7 + 1);
  return out;
}

// The Error message parse() gives, or "" when it parses.
inline std::string parse_error(std::span<const std::byte> bytes, const std::string& name = "test.safetensors") {
  try {
    SafetensorsFile::parse(bytes, name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every view of a parsed file lies inside the data section of `bytes` and is consistent with its
// dtype and shape; also reads every byte, so ASan sees any view past the buffer.
inline void expect_views_inside(const TensorMap& tensors, std::span<const std::byte> bytes) {
  const std::byte* begin = bytes.data();
  const std::byte* end = bytes.data() + bytes.size();
  unsigned sum = 0;
  for (const auto& [name, v] : tensors) {
    ASSERT_EQ(name, v.name);
    for (int64_t d : v.shape) ASSERT_GE(d, 0) << name;
    const size_t n = v.n_bytes();
    ASSERT_TRUE(v.data >= begin + 8 && v.data <= end && n <= static_cast<size_t>(end - v.data)) << name;
    for (size_t i = 0; i < n; ++i) sum += static_cast<unsigned>(v.data[i]);
  }
  volatile unsigned sink = sum;
  (void)sink;
}

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    SplitMix64 rng(test_seed() ^ reinterpret_cast<uintptr_t>(this));
    path_ = std::filesystem::temp_directory_path() /
            ("megadecode-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(rng.next() % 1000000007));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

}  // namespace megadecode::st_test
