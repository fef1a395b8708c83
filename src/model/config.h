// ModelConfig: the model's shape and semantics, read from a Hugging Face config.json.
// Every field that changes the computation is read from the file (real checkpoints differ:
// rope_theta 1e6 vs 1e7, norm_topk_prob); a missing one is an Error naming the field.
// The per-layer LayerSpec list and the enums below leave room for families with parallel
// attention+FFN blocks, sliding-window and NoPE layers, sigmoid routers, dense prefix layers and
// tied embeddings (cohere2_moe) without changing the reference model's structure.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace megadecode {

enum class RopeStyle { kNeox, kInterleaved };       // rotate-half pairs (i, i+d/2) vs adjacent pairs (2i, 2i+1)
enum class RouterKind { kSoftmaxTopK, kSigmoidTopK };  // softmax over all experts then top-k; or sigmoid of top-k logits
enum class BlockKind { kSequential, kParallel };    // x+Attn(N1 x), then +FFN(N2 h); or x + Attn(N x) + FFN(N x)
enum class FfnKind { kDense, kMoe };

struct LayerSpec {
  int sliding_window = 0;  // 0: full attention; otherwise the number of keys attended, the current one included
  bool use_rope = true;
  FfnKind ffn = FfnKind::kMoe;
};

struct ModelConfig {
  std::string model_type;  // "qwen3_moe" or "qwen3"
  int hidden_size = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 0.0f;
  double rope_theta = 0.0;
  RopeStyle rope_style = RopeStyle::kNeox;
  bool qk_norm = true;  // per-head RMSNorm on q and k before RoPE
  BlockKind block = BlockKind::kSequential;
  bool tie_word_embeddings = false;

  int intermediate_size = 0;  // dense FFN width (layers whose ffn is kDense)
  int n_experts = 0;
  int n_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  RouterKind router = RouterKind::kSoftmaxTopK;

  std::vector<int> eos_token_ids;
  int bos_token_id = -1;  // -1: none given
  std::string torch_dtype;

  std::vector<LayerSpec> layers;  // n_layers entries

  int q_size() const { return n_heads * head_dim; }
  int kv_size() const { return n_kv_heads * head_dim; }
  int group_size() const { return n_heads / n_kv_heads; }
  bool is_moe_layer(int layer) const { return layers.at(layer).ffn == FfnKind::kMoe; }
  // bf16 bytes of one token's K and V over all layers.
  size_t kv_bytes_per_token() const { return static_cast<size_t>(n_layers) * 2 * kv_size() * 2; }
};

// Parses config.json text/values. `source` names the file in error messages.
ModelConfig parse_model_config(const nlohmann::json& json, const std::string& source);
ModelConfig load_model_config(const std::filesystem::path& model_dir);
// The config.json a Hugging Face checkpoint of this shape carries (inverse of parse_model_config).
nlohmann::json model_config_to_json(const ModelConfig& config);

}  // namespace megadecode
