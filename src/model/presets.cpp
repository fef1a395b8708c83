#include "model/presets.h"

#include "core/check.h"

namespace megadecode {
namespace {

constexpr int kQwen3Vocab = 151936;
constexpr int kQwen3Bos = 151643;  // <|endoftext|>
constexpr int kQwen3Eos = 151645;  // <|im_end|>

ModelConfig qwen3_moe_base() {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.vocab_size = kQwen3Vocab;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 1e6;
  c.rope_style = RopeStyle::kNeox;
  c.qk_norm = true;
  c.block = BlockKind::kSequential;
  c.router = RouterKind::kSoftmaxTopK;
  c.norm_topk_prob = true;
  c.tie_word_embeddings = false;
  c.bos_token_id = kQwen3Bos;
  c.eos_token_ids = {kQwen3Eos};
  c.torch_dtype = "bfloat16";
  return c;
}

void set_layers(ModelConfig& c, int n_layers) {
  c.n_layers = n_layers;
  c.layers.assign(n_layers, LayerSpec{0, true, FfnKind::kMoe});
}

ModelConfig full_widths(ModelConfig c) {
  c.hidden_size = 2048;
  c.n_heads = 32;
  c.n_kv_heads = 4;
  c.head_dim = 128;
  c.n_experts = 128;
  c.n_experts_per_tok = 8;
  c.moe_intermediate_size = 768;
  c.intermediate_size = 6144;
  c.max_position_embeddings = 40960;
  return c;
}

// North Mini Code 1.0 (cohere2_moe): the shape its published configuration gives (49 layers;
// hidden 2048; 32 query and 4 KV heads of 128; 128 experts of 768, top-8 by sigmoid without
// renormalisation; layer 0 dense of 3072 with RoPE and full attention; then every fourth layer
// full attention without position encoding, the others a 4096 sliding window with interleaved
// RoPE, theta 50,000; RMSNorm 1e-6; tied embeddings). Not confirmed against the model's own
// config.json: logit_scale (1.0, as the North ports use; transformers' default is 0.0625) and the
// bos/eos ids (transformers' Cohere defaults 5 and 255001).
constexpr int kNorthVocab = 262144;

ModelConfig north_base(int n_layers, int window) {
  ModelConfig c;
  c.model_type = "cohere2_moe";
  c.vocab_size = kNorthVocab;
  c.rms_norm_eps = 1e-6f;
  c.norm = NormKind::kRms;
  c.rope_theta = 50000.0;
  c.rope_style = RopeStyle::kInterleaved;
  c.qk_norm = false;
  c.block = BlockKind::kParallel;
  c.router = RouterKind::kSigmoidTopK;
  c.norm_topk_prob = false;
  c.tie_word_embeddings = true;
  c.logit_scale = 1.0f;
  c.bos_token_id = 5;
  c.eos_token_ids = {255001};
  c.torch_dtype = "bfloat16";
  c.hidden_size = 2048;
  c.n_heads = 32;
  c.n_kv_heads = 4;
  c.head_dim = 128;
  c.n_experts = 128;
  c.n_experts_per_tok = 8;
  c.moe_intermediate_size = 768;
  c.intermediate_size = 3072;
  c.max_position_embeddings = 500000;
  c.n_layers = n_layers;
  c.layers.resize(n_layers);
  for (int i = 0; i < n_layers; ++i) {
    LayerSpec& L = c.layers[i];
    L.ffn = i == 0 ? FfnKind::kDense : FfnKind::kMoe;
    L.sliding_window = i % 4 == 0 ? 0 : window;
    L.use_rope = i == 0 || i % 4 != 0;
  }
  return c;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"tiny", "small", "qwen3-30b-a3b", "north-tiny", "north-small", "north-mini-code"};
}

ModelConfig preset_config(const std::string& name) {
  if (name == "north-mini-code") return north_base(49, 4096);
  if (name == "north-small") return north_base(5, 4096);  // full widths; one layer of each kind and a second full
  if (name == "north-tiny") {
    // CPU tests: the real vocabulary, narrow layers, a 24-key window (contexts pass it at once),
    // and logit_scale 0.5 so that the scaling is exercised.
    ModelConfig c = north_base(5, 24);
    c.hidden_size = 128;
    c.n_heads = 8;
    c.n_kv_heads = 2;
    c.head_dim = 32;
    c.n_experts = 16;
    c.n_experts_per_tok = 4;
    c.moe_intermediate_size = 64;
    c.intermediate_size = 192;
    c.max_position_embeddings = 8192;
    c.logit_scale = 0.5f;
    return c;
  }
  ModelConfig c = qwen3_moe_base();
  if (name == "tiny") {
    c.hidden_size = 128;
    c.n_heads = 8;
    c.n_kv_heads = 2;
    c.head_dim = 32;  // q width 256 != hidden 128, as in the real model
    c.n_experts = 16;
    c.n_experts_per_tok = 4;
    c.moe_intermediate_size = 64;
    c.intermediate_size = 256;
    c.max_position_embeddings = 8192;
    set_layers(c, 3);
    return c;
  }
  if (name == "small") {
    c = full_widths(c);
    set_layers(c, 2);
    return c;
  }
  if (name == "qwen3-30b-a3b") {
    c = full_widths(c);
    set_layers(c, 48);
    return c;
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(cat("unknown preset \"", name, "\" (known: ", known, ")"));
}

}  // namespace megadecode
