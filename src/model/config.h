// ModelConfig: the model's shape and semantics, read from a Hugging Face config.json.
// Every field that changes the computation is read from the file (real checkpoints differ:
// rope_theta 1e6 vs 1e7, norm_topk_prob); a missing one is an Error naming the field, one this
// code cannot honour is an Error saying so. Two families:
//  - qwen3_moe / qwen3: sequential blocks, q/k RMSNorm, NeoX RoPE on every layer, softmax router.
//  - cohere2_moe (North Mini Code): parallel blocks (one norm feeds attention and the FFN), no
//    q/k norm, sliding-window layers with interleaved RoPE and full-attention layers without
//    position encoding (except a RoPE'd dense prefix), sigmoid or softmax router, optional shared
//    experts, LayerNorm when rms_norm_eps is absent, logits times logit_scale, tied embeddings.
//    Semantics as transformers' modeling_cohere2_moe (the sliding window holds the current key
//    and the window-1 before it; vLLM attends one key more).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace megadecode {

enum class RopeStyle { kNeox, kInterleaved };       // rotate-half pairs (i, i+d/2) vs adjacent pairs (2i, 2i+1)
enum class RouterKind { kSoftmaxTopK, kSigmoidTopK };  // softmax over all experts then top-k; or sigmoid of top-k logits
enum class BlockKind { kSequential, kParallel };    // x+Attn(N1 x), then +FFN(N2 h); or x + Attn(N x) + FFN(N x)
enum class FfnKind { kDense, kMoe };
enum class NormKind { kRms, kLayer };                // RMSNorm; or mean-centred LayerNorm, weight only
enum class SharedCombine { kSum, kAverage };         // routed + shared; or (routed + shared) / 2

struct LayerSpec {
  int sliding_window = 0;  // 0: full attention; otherwise the number of keys attended, the current one included
  bool use_rope = true;
  FfnKind ffn = FfnKind::kMoe;
};

struct ModelConfig {
  std::string model_type;  // "qwen3_moe", "qwen3" or "cohere2_moe"
  int hidden_size = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 0.0f;  // the epsilon of every norm (layer_norm_eps under NormKind::kLayer)
  NormKind norm = NormKind::kRms;
  double rope_theta = 0.0;
  RopeStyle rope_style = RopeStyle::kNeox;
  bool qk_norm = true;  // per-head RMSNorm on q and k before RoPE
  BlockKind block = BlockKind::kSequential;
  bool tie_word_embeddings = false;
  float logit_scale = 1.0f;  // logits = lm_head(norm(x)) * logit_scale

  int intermediate_size = 0;  // dense FFN width (layers whose ffn is kDense)
  int n_experts = 0;
  int n_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  RouterKind router = RouterKind::kSoftmaxTopK;
  // Shared experts: one SwiGLU MLP of width shared_intermediate_size on every MoE layer's input,
  // combined with the routed experts' sum as `shared_combine` says. 0: none.
  int shared_intermediate_size = 0;
  SharedCombine shared_combine = SharedCombine::kSum;

  std::vector<int> eos_token_ids;
  int bos_token_id = -1;  // -1: none given
  std::string torch_dtype;

  std::vector<LayerSpec> layers;  // n_layers entries

  int q_size() const { return n_heads * head_dim; }
  int kv_size() const { return n_kv_heads * head_dim; }
  int group_size() const { return n_heads / n_kv_heads; }
  bool is_moe_layer(int layer) const { return layers.at(layer).ffn == FfnKind::kMoe; }
  bool is_sliding_layer(int layer) const { return layers.at(layer).sliding_window > 0; }
  // The largest sliding window of any layer; 0 when every layer attends to the full context.
  int max_sliding_window() const {
    int w = 0;
    for (const LayerSpec& l : layers) w = l.sliding_window > w ? l.sliding_window : w;
    return w;
  }
  // SiLU(gate) * up elements one token's FFN holds at once, the largest layer's: a MoE layer's K
  // experts' (and its shared experts'), or a dense layer's MLP.
  int64_t ffn_act_per_token() const {
    int64_t n = 0;
    for (const LayerSpec& l : layers)
      n = std::max<int64_t>(n, l.ffn == FfnKind::kMoe
                                   ? int64_t{n_experts_per_tok} * moe_intermediate_size + shared_intermediate_size
                                   : int64_t{intermediate_size});
    return n;
  }
  int n_sliding_layers() const {
    int n = 0;
    for (const LayerSpec& l : layers) n += l.sliding_window > 0 ? 1 : 0;
    return n;
  }
};

// Parses config.json text/values. `source` names the file in error messages.
ModelConfig parse_model_config(const nlohmann::json& json, const std::string& source);
ModelConfig load_model_config(const std::filesystem::path& model_dir);
// The config.json a Hugging Face checkpoint of this shape carries (inverse of parse_model_config).
nlohmann::json model_config_to_json(const ModelConfig& config);

}  // namespace megadecode
