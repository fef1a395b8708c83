// Synthetic checkpoints: every weight of a model config made from a seed by the pure function in
// synthetic_init.h, either in memory (tests on tiny/small presets) or streamed to disk as an HF
// safetensors checkpoint (`megadecode make-model`). All weights are bf16.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "model/config.h"
#include "model/synthetic_init.h"
#include "model/tensor.h"

namespace megadecode {

// The kind and dimensions of a tensor of this config, from its name; Error for a name the config
// does not have.
SyntheticInit synthetic_init_for(const std::string& name, const ModelConfig& config);

// Fills `out` (n elements of `dtype`, row-major) with elements 0..n-1 of the synthetic tensor,
// spread over hardware threads when large.
void fill_synthetic(uint64_t seed, const SyntheticInit& init, Dtype dtype, std::span<std::byte> out);

// Every tensor of expected_tensors(config), in memory.
std::unique_ptr<TensorStore> make_synthetic_tensors(const ModelConfig& config, uint64_t seed);

// Streams the same tensors to model_dir as model.safetensors, or shards past max_shard_bytes.
// progress(bytes_done, bytes_total) is called after each tensor when given.
void write_synthetic_checkpoint(const std::filesystem::path& model_dir, const ModelConfig& config, uint64_t seed,
                                size_t max_shard_bytes,
                                const std::function<void(size_t, size_t)>& progress = {});

}  // namespace megadecode
