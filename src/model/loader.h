// LoadedModel: a model directory (config.json + safetensors) opened, mapped and bound to the
// model's structure, or the same built in memory from synthetic weights (tests). It owns the bytes
// its views point into (the mapped files or the TensorStore); moving it keeps every view valid.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "model/config.h"
#include "model/safetensors.h"
#include "model/tensor.h"
#include "model/weights.h"

namespace megadecode {

struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<Checkpoint> checkpoint;  // set by load_model: owns the mapped files
  std::unique_ptr<TensorStore> store;      // set by synthetic_model: owns the in-memory tensors
  ModelWeights weights;                    // views into one of the two above

  const TensorMap& tensors() const { return checkpoint ? checkpoint->tensors() : store->tensors(); }
};

// config.json + model.safetensors (or index + shards), validated against the config: Error naming
// the file and tensor for anything missing, unexpected or misshapen.
LoadedModel load_model(const std::filesystem::path& model_dir);

// The weights `make-model --preset NAME --seed S` would write, built in memory.
LoadedModel synthetic_model(const std::string& preset, uint64_t seed);
LoadedModel synthetic_model(const ModelConfig& config, uint64_t seed);

}  // namespace megadecode
