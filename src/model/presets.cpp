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

}  // namespace

std::vector<std::string> preset_names() { return {"tiny", "small", "qwen3-30b-a3b"}; }

ModelConfig preset_config(const std::string& name) {
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
