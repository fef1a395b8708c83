// DeviceWeights: every weight of a model the CUDA backends run (qwen3_moe; cohere2_moe without
// shared experts, RMSNorm) in one device arena, in the layouts the megakernel reads
// (megakernel/types.h): GEMM weights packed for the skinny GEMM (fused QKV rows in
// group-major order, expert gate/up interleaved per 8 rows), norms raw, embedding row-major.
// Two sources: a loaded checkpoint (host views uploaded tensor by tensor, packed on the GPU,
// progress reported), or synthetic weights generated on the GPU with the same pure function as
// `make-model` (model/synthetic_init.h), bit-identical to the host checkpoint of that seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/megakernel/types.h"
#include "engine/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace megadecode::cuda {

// progress(bytes_done, bytes_total) after each tensor.
using WeightProgress = std::function<void(size_t, size_t)>;

class DeviceWeights {
 public:
  // Synthetic weights of `seed` (what `make-model --seed` writes), generated on the device.
  static std::unique_ptr<DeviceWeights> synthetic(const ModelConfig& config, uint64_t seed,
                                                  const WeightProgress& progress = {});
  // A checkpoint's weights (bf16 tensors), uploaded and packed.
  static std::unique_ptr<DeviceWeights> upload(const ModelConfig& config, const ModelWeights& weights,
                                               const WeightProgress& progress = {});
  ~DeviceWeights();
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  const ModelConfig& config() const { return config_; }
  const MkModelWeights& view() const { return view_; }  // device pointers, for MkParams
  size_t bytes() const { return bytes_; }
  const void* arena() const { return arena_; }  // tests compare whole arenas
  // Host copy of the layers' pointers (the prefill runner's; tests read packed matrices back).
  const MkLayerWeights& layer(int l) const { return layers_.at(l); }
  std::span<const MkLayerWeights> layers() const { return layers_; }

 private:
  explicit DeviceWeights(const ModelConfig& config);
  // Tensor source: writes the named [rows, cols] tensor row-major bf16 into dst (device).
  using Source = std::function<void(const std::string& name, int64_t rows, int64_t cols, uint16_t* dst)>;
  void build(const Source& source, const std::string& lm_head_name, const WeightProgress& progress);

  ModelConfig config_;
  void* arena_ = nullptr;
  size_t bytes_ = 0;
  std::vector<MkLayerWeights> layers_;
  MkLayerWeights* layers_dev_ = nullptr;
  float2* rope_ = nullptr;  // the RoPE table (MkModelWeights::rope)
  MkModelWeights view_{};
};

// Error for what the device paths cannot run of the model (every CUDA backend runs the same set:
// qwen3_moe, and cohere2_moe without shared experts or LayerNorm).
void check_supported(const ModelConfig& config);

}  // namespace megadecode::cuda
