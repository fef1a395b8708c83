// MappedFile: a read-only memory map of one whole file (the bytes of a safetensors shard).
// The mapping lives as long as the object; views into it (TensorView::data) must not outlive it.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>

namespace megadecode {

class MappedFile {
 public:
  // Maps `path` read-only; Error naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;  // nullptr for an empty file (mmap of 0 bytes is not allowed)
  size_t size_ = 0;
};

}  // namespace megadecode
