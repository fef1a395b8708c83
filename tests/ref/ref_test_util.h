// Shared helpers for the reference-engine tests: small hand-made configs, random in-memory weights
// (TensorStore + bind_weights). The independent textbook model is in naive_model.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/config.h"
#include "model/tensor.h"
#include "model/weights.h"

namespace megadecode::test {

// qwen3_moe-shaped, tiny: hidden 64, 3 layers, 4 heads / 2 KV heads of 16, 8 experts top-2, vocab 500.
inline ModelConfig small_moe_config() {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.hidden_size = 64;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 500;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 10000.0;
  c.intermediate_size = 96;
  c.n_experts = 8;
  c.n_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.norm_topk_prob = true;
  c.eos_token_ids = {499};
  c.layers.assign(3, LayerSpec{0, true, FfnKind::kMoe});
  return c;
}

// The other variants at once (cohere2_moe-like): parallel blocks, a dense first layer, sliding
// windows, NoPE layers, interleaved RoPE, sigmoid router without renormalisation, no q/k norm, tied
// embeddings.
inline ModelConfig variant_config() {
  ModelConfig c = small_moe_config();
  c.model_type = "variant";
  c.n_layers = 4;
  c.block = BlockKind::kParallel;
  c.rope_style = RopeStyle::kInterleaved;
  c.router = RouterKind::kSigmoidTopK;
  c.norm_topk_prob = false;
  c.qk_norm = false;
  c.tie_word_embeddings = true;
  c.n_experts_per_tok = 3;
  c.layers = {LayerSpec{0, true, FfnKind::kDense}, LayerSpec{5, true, FfnKind::kMoe},
              LayerSpec{0, false, FfnKind::kMoe}, LayerSpec{3, true, FfnKind::kMoe}};
  return c;
}

// cohere2_moe-shaped (North Mini Code's structure at test size): a dense full-attention first
// layer with RoPE, three sliding layers of 5 keys, a full NoPE layer; sigmoid top-3 of 8 without
// renormalisation; logits * 0.0625; tied embeddings. Variants set shared experts and LayerNorm.
inline ModelConfig cohere_config() {
  ModelConfig c = small_moe_config();
  c.model_type = "cohere2_moe";
  c.n_layers = 5;
  c.block = BlockKind::kParallel;
  c.rope_style = RopeStyle::kInterleaved;
  c.router = RouterKind::kSigmoidTopK;
  c.norm_topk_prob = false;
  c.qk_norm = false;
  c.tie_word_embeddings = true;
  c.logit_scale = 0.0625f;
  c.n_experts_per_tok = 3;
  c.layers = {LayerSpec{0, true, FfnKind::kDense}, LayerSpec{5, true, FfnKind::kMoe}, LayerSpec{5, true, FfnKind::kMoe},
              LayerSpec{5, true, FfnKind::kMoe}, LayerSpec{0, false, FfnKind::kMoe}};
  return c;
}

// Dense qwen3-shaped.
inline ModelConfig dense_config() {
  ModelConfig c = small_moe_config();
  c.model_type = "qwen3";
  c.n_layers = 2;
  c.n_experts = 0;
  c.n_experts_per_tok = 0;
  c.layers.assign(2, LayerSpec{0, true, FfnKind::kDense});
  return c;
}

struct TestWeights {
  std::shared_ptr<TensorStore> store;
  ModelWeights weights;
};

inline void store_value(std::byte* p, Dtype dtype, int64_t i, float v) {
  if (dtype == Dtype::kF32) {
    std::memcpy(p + 4 * i, &v, 4);
  } else {
    const uint16_t b = dtype == Dtype::kBF16 ? float_to_bf16_bits(v) : float_to_fp16_bits(v);
    std::memcpy(p + 2 * i, &b, 2);
  }
}

// Random weights: norms 1 + 0.2 N(0,1), embedding N(0,1), projections N(0,1)/sqrt(fan_in).
inline TestWeights random_weights(const ModelConfig& c, Dtype dtype, uint64_t seed) {
  TestWeights t;
  t.store = std::make_shared<TensorStore>();
  SplitMix64 rng(seed);
  for (const TensorSpec& s : expected_tensors(c)) {
    std::byte* p = t.store->add(s.name, dtype, s.shape);
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    const bool is_norm = s.shape.size() == 1;
    const bool is_embed = s.name == "model.embed_tokens.weight";
    const float scale = is_norm || is_embed ? 1.0f : 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
    for (int64_t i = 0; i < n; ++i) {
      const float v = is_norm ? 1.0f + 0.2f * rng.normal() : scale * rng.normal();
      store_value(p, dtype, i, v);
    }
  }
  t.weights = bind_weights(c, t.store->tensors());
  return t;
}

inline std::vector<int32_t> random_tokens(SplitMix64& rng, int n, int vocab) {
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = static_cast<int32_t>(rng.below(vocab));
  return out;
}

}  // namespace megadecode::test
