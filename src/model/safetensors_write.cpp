// Safetensors writing, streamed: each file's header goes out first, then each tensor's bytes are
// produced into one reused buffer (the size of the largest tensor) and appended. Memory stays at
// one tensor whatever the checkpoint's size (the full qwen3-30b-a3b preset is 61 GB on disk).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "model/safetensors.h"

namespace megadecode {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string shard_name(size_t index, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buf;
}

bool is_shard_name(const std::string& s) {
  unsigned a = 0, b = 0;
  int consumed = 0;
  return std::sscanf(s.c_str(), "model-%5u-of-%5u.safetensors%n", &a, &b, &consumed) == 2 &&
         static_cast<size_t>(consumed) == s.size();
}

// A new checkpoint of another layout must not leave the old one where a reader finds it first
// (nor the .partial leftovers of an interrupted write).
void remove_stale_checkpoint(const fs::path& dir) {
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.ends_with(".partial")) name.resize(name.size() - 8);
    if (name == "model.safetensors" || name == "model.safetensors.index.json" || is_shard_name(name)) {
      fs::remove(e.path());
    }
  }
}

class OutFile {
 public:
  explicit OutFile(const fs::path& path) : path_(path.string()) {
    f_ = std::fopen(path_.c_str(), "wb");
    MD_REQUIRE(f_ != nullptr, "cannot create ", path_, ": ", std::strerror(errno));
  }
  ~OutFile() {
    if (f_ != nullptr) std::fclose(f_);
  }
  void write(const void* data, size_t n) {
    MD_REQUIRE(n == 0 || std::fwrite(data, 1, n, f_) == n, "cannot write ", path_, ": ", std::strerror(errno));
  }
  void close() {
    int rc = std::fclose(f_);
    f_ = nullptr;
    MD_REQUIRE(rc == 0, "cannot write ", path_, ": ", std::strerror(errno));
  }

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

struct Planned {
  const TensorToWrite* tensor;
  size_t n_bytes;
};

size_t checked_bytes(const TensorToWrite& t) {
  size_t n = dtype_bytes(t.dtype);
  for (int64_t d : t.shape) {
    MD_REQUIRE(d >= 0, "write_checkpoint: tensor ", t.name, " has a negative dimension ", d);
    MD_REQUIRE(!__builtin_mul_overflow(n, static_cast<size_t>(d), &n), "write_checkpoint: tensor ", t.name,
               " is too large");
  }
  return n;
}

// Header JSON padded with spaces to a multiple of 8 bytes, so the data section is 8-byte aligned.
std::string header_text(std::vector<Planned>& shard) {
  std::stable_sort(shard.begin(), shard.end(), [](const Planned& a, const Planned& b) {
    return dtype_bytes(a.tensor->dtype) > dtype_bytes(b.tensor->dtype);
  });
  json h = json::object();
  h["__metadata__"] = {{"format", "pt"}};  // transformers refuses files whose format is not pt/tf/flax/mlx
  size_t offset = 0;
  for (const Planned& p : shard) {
    h[p.tensor->name] = {{"dtype", dtype_name(p.tensor->dtype)},
                         {"shape", p.tensor->shape},
                         {"data_offsets", {offset, offset + p.n_bytes}}};
    offset += p.n_bytes;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

void write_checkpoint(const fs::path& model_dir, const std::vector<TensorToWrite>& tensors,
                      const std::function<void(const TensorToWrite&, std::span<std::byte>)>& fill,
                      size_t max_shard_bytes, const std::function<void(size_t, size_t)>& progress) {
  MD_REQUIRE(max_shard_bytes > 0, "write_checkpoint: max_shard_bytes must be positive");
  std::set<std::string> names;
  std::vector<std::vector<Planned>> shards(1);
  size_t shard_bytes = 0, total = 0, largest = 0;
  for (const TensorToWrite& t : tensors) {
    MD_REQUIRE(!t.name.empty() && t.name != "__metadata__", "write_checkpoint: invalid tensor name \"", t.name, "\"");
    MD_REQUIRE(names.insert(t.name).second, "write_checkpoint: duplicate tensor ", t.name);
    const size_t n = checked_bytes(t);
    // Greedy in the given order, like HF: a tensor larger than the limit gets a shard of its own.
    if (!shards.back().empty() && shard_bytes + n > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back({&t, n});
    shard_bytes += n;
    total += n;
    largest = std::max(largest, n);
  }

  fs::create_directories(model_dir);
  remove_stale_checkpoint(model_dir);
  // One buffer reused for every tensor; `fill` sees it zeroed so unwritten bytes are never garbage.
  auto buffer = std::make_unique<std::byte[]>(std::max<size_t>(largest, 1));
  json weight_map = json::object();
  size_t done = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shards.size() == 1 ? "model.safetensors" : shard_name(s, shards.size());
    const fs::path final_path = model_dir / name;
    const fs::path partial_path = model_dir / (name + ".partial");  // renamed once complete
    const std::string header = header_text(shards[s]);
    try {
      OutFile out(partial_path);
      uint8_t length[8];
      for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
      out.write(length, 8);
      out.write(header.data(), header.size());
      for (const Planned& p : shards[s]) {
        std::memset(buffer.get(), 0, p.n_bytes);
        fill(*p.tensor, std::span<std::byte>(buffer.get(), p.n_bytes));
        out.write(buffer.get(), p.n_bytes);
        weight_map[p.tensor->name] = name;
        done += p.n_bytes;
        if (progress) progress(done, total);
      }
      out.close();
    } catch (...) {
      std::error_code ignored;
      fs::remove(partial_path, ignored);  // never leave a file that looks like part of a checkpoint
      throw;
    }
    fs::rename(partial_path, final_path);
  }
  if (shards.size() > 1) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const fs::path partial_path = model_dir / "model.safetensors.index.json.partial";
    OutFile out(partial_path);
    const std::string text = index.dump(2) + "\n";
    out.write(text.data(), text.size());
    out.close();
    fs::rename(partial_path, model_dir / "model.safetensors.index.json");
  }
}

}  // namespace megadecode
