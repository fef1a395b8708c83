// Synthetic checkpoints: the kind of each tensor from its name, the fill (threaded for big tensors),
// and the in-memory and on-disk (streamed) forms of a whole model.
#include "model/synthetic.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "core/check.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace megadecode {
namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

SyntheticKind kind_of(const std::string& name) {
  if (name == "model.embed_tokens.weight") return SyntheticKind::kEmbedding;
  if (name == "lm_head.weight") return SyntheticKind::kLmHead;
  if (ends_with(name, "norm.weight")) return SyntheticKind::kNorm;  // *_layernorm, q_norm, k_norm, model.norm
  if (ends_with(name, ".o_proj.weight")) return SyntheticKind::kOutProj;
  if (ends_with(name, ".mlp.gate.weight")) return SyntheticKind::kRouter;
  if (ends_with(name, ".down_proj.weight")) {
    return name.find(".mlp.experts.") != std::string::npos ? SyntheticKind::kExpertDown : SyntheticKind::kDenseDown;
  }
  return SyntheticKind::kInProj;  // q/k/v_proj, gate_proj, up_proj
}

SyntheticInit init_for_spec(const std::string& name, const std::vector<int64_t>& shape, const ModelConfig& config) {
  SyntheticDims dims;
  dims.fan_in = shape.size() == 2 ? static_cast<int>(shape[1]) : 1;  // HF Linear: [out, in]
  dims.n_layers = config.n_layers;
  dims.n_experts_per_tok = config.n_experts_per_tok;
  dims.unnormalised_weights = config.router == RouterKind::kSigmoidTopK && !config.norm_topk_prob;
  return synthetic_init(synthetic_tensor_id(name), kind_of(name), dims);
}

template <typename Store>
void fill_range(uint64_t seed, const SyntheticInit& init, std::byte* out, uint64_t begin, uint64_t end, Store store) {
  for (uint64_t i = begin; i < end; ++i) store(out, i, synthetic_value(seed, init, i));
}

void fill_range(uint64_t seed, const SyntheticInit& init, Dtype dtype, std::byte* out, uint64_t begin, uint64_t end) {
  switch (dtype) {
    case Dtype::kBF16:
      return fill_range(seed, init, out, begin, end, [](std::byte* o, uint64_t i, float v) {
        uint16_t b = float_to_bf16_bits(v);
        std::memcpy(o + 2 * i, &b, 2);
      });
    case Dtype::kF16:
      return fill_range(seed, init, out, begin, end, [](std::byte* o, uint64_t i, float v) {
        uint16_t b = float_to_fp16_bits(v);
        std::memcpy(o + 2 * i, &b, 2);
      });
    case Dtype::kF32:
      return fill_range(seed, init, out, begin, end,
                        [](std::byte* o, uint64_t i, float v) { std::memcpy(o + 4 * i, &v, 4); });
  }
}

}  // namespace

SyntheticInit synthetic_init_for(const std::string& name, const ModelConfig& config) {
  for (const TensorSpec& s : expected_tensors(config)) {
    if (s.name == name) return init_for_spec(s.name, s.shape, config);
  }
  throw Error(cat("synthetic_init_for: ", name, " is not a tensor of a ", config.model_type, " model of this config"));
}

void fill_synthetic(uint64_t seed, const SyntheticInit& init, Dtype dtype, std::span<std::byte> out) {
  MD_CHECK(out.size() % dtype_bytes(dtype) == 0);
  const uint64_t n = out.size() / dtype_bytes(dtype);
  constexpr uint64_t kPerThread = uint64_t{1} << 20;  // below this, starting a thread costs more than it saves
  const uint64_t n_threads =
      std::clamp<uint64_t>(n / kPerThread, 1, std::max(1u, std::thread::hardware_concurrency()));
  if (n_threads == 1) return fill_range(seed, init, dtype, out.data(), 0, n);
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] { fill_range(seed, init, dtype, out.data(), n * t / n_threads, n * (t + 1) / n_threads); });
  }
  for (std::thread& t : threads) t.join();
}

std::unique_ptr<TensorStore> make_synthetic_tensors(const ModelConfig& config, uint64_t seed) {
  auto store = std::make_unique<TensorStore>();
  for (const TensorSpec& s : expected_tensors(config)) {
    std::byte* data = store->add(s.name, Dtype::kBF16, s.shape);
    const TensorView& v = store->tensors().at(s.name);
    fill_synthetic(seed, init_for_spec(s.name, s.shape, config), Dtype::kBF16, std::span<std::byte>(data, v.n_bytes()));
  }
  return store;
}

void write_synthetic_checkpoint(const std::filesystem::path& model_dir, const ModelConfig& config, uint64_t seed,
                                size_t max_shard_bytes, const std::function<void(size_t, size_t)>& progress) {
  std::vector<TensorToWrite> tensors;
  for (TensorSpec& s : expected_tensors(config)) tensors.push_back({std::move(s.name), Dtype::kBF16, std::move(s.shape)});
  write_checkpoint(
      model_dir, tensors,
      [&](const TensorToWrite& t, std::span<std::byte> out) {
        fill_synthetic(seed, init_for_spec(t.name, t.shape, config), t.dtype, out);
      },
      max_shard_bytes, progress);
}

}  // namespace megadecode
