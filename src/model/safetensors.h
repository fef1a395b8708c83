// Safetensors: memory-mapped reading of single files and sharded checkpoints
// (model.safetensors.index.json), and streaming writing (no whole checkpoint in memory).
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets:
// [begin, end]}, "__metadata__": {...}}, then the data section. Every malformed input is an
// Error naming the file (and tensor): truncated file, header past the end, bad JSON, unknown
// dtype, offsets out of range / overlapping / not matching dtype*shape. Like Hugging Face's
// reader, the tensors must tile the data section exactly: gaps and trailing bytes are errors too,
// and so are repeated tensor names or fields (which HF would resolve silently).
#pragma once

#include <filesystem>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/tensor.h"

namespace megadecode {

class MappedFile;  // read-only mmap of one file

// One .safetensors file, mapped for its lifetime.
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  // Parses from a byte buffer owned by the caller (fuzz tests); `name` is used in messages.
  static std::unique_ptr<SafetensorsFile> parse(std::span<const std::byte> bytes, const std::string& name);
  ~SafetensorsFile();
  const TensorMap& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  std::unique_ptr<MappedFile> file_;
  TensorMap tensors_;
};

// A checkpoint directory: model.safetensors, or model.safetensors.index.json and its shards.
// Every tensor the index names must be in the shard it names; shards may not repeat a tensor.
class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& model_dir);
  const TensorMap& tensors() const { return tensors_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  TensorMap tensors_;
};

// Headers longer than this are refused as absurd (the limit Hugging Face's reader uses).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Streams a checkpoint to disk: headers are written first, then each tensor's bytes produced by
// `fill(spec, out)` one at a time into one reused buffer (the size of the largest tensor; `out` is
// zeroed before each call). Past max_shard_bytes the checkpoint is sharded as HF does
// (model-00001-of-0000N.safetensors + model.safetensors.index.json); otherwise one model.safetensors.
// Within a file, tensors are laid out widest dtype first (so every tensor is aligned to its dtype),
// then in the given order. Stale checkpoint files of another layout in model_dir are removed.
// `progress(bytes_done, bytes_total)`, when given, is called after each tensor is written.
struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::kBF16;
  std::vector<int64_t> shape;
};
void write_checkpoint(const std::filesystem::path& model_dir, const std::vector<TensorToWrite>& tensors,
                      const std::function<void(const TensorToWrite&, std::span<std::byte>)>& fill,
                      size_t max_shard_bytes,
                      const std::function<void(size_t bytes_done, size_t bytes_total)>& progress = {});

}  // namespace megadecode
