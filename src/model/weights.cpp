#include "model/weights.h"

#include <set>
#include <string_view>

namespace megadecode {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A ".bias" of a tensor the model has, all zero (a non-zero one is an Error: the model has no
// biases, so it would be dropped silently).
bool is_zero_bias(const std::string& name, const TensorView& t, const std::set<std::string>& expected) {
  constexpr std::string_view kBias = ".bias";
  if (name.size() <= kBias.size() || name.compare(name.size() - kBias.size(), kBias.size(), kBias) != 0) return false;
  if (expected.count(name.substr(0, name.size() - kBias.size()) + ".weight") == 0) return false;
  for (int64_t i = 0; i < t.n_elements(); ++i) {
    MD_REQUIRE(t.at(i) == 0.0f, "tensor ", name, " in ", t.file, " has a non-zero element (", t.at(i), " at ", i,
               "); this model has no biases");
  }
  return true;
}

}  // namespace

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size();
  std::vector<TensorSpec> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {h}});
    if (c.block == BlockKind::kSequential) out.push_back({p + "post_attention_layernorm.weight", {h}});
    out.push_back({p + "self_attn.q_proj.weight", {q, h}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.o_proj.weight", {h, q}});
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    if (c.is_moe_layer(l)) {
      out.push_back({p + "mlp.gate.weight", {c.n_experts, h}});
      for (int e = 0; e < c.n_experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        out.push_back({x + "gate_proj.weight", {c.moe_intermediate_size, h}});
        out.push_back({x + "up_proj.weight", {c.moe_intermediate_size, h}});
        out.push_back({x + "down_proj.weight", {h, c.moe_intermediate_size}});
      }
      if (c.shared_intermediate_size > 0) {
        const std::string x = p + "mlp.shared_experts.";
        out.push_back({x + "gate_proj.weight", {c.shared_intermediate_size, h}});
        out.push_back({x + "up_proj.weight", {c.shared_intermediate_size, h}});
        out.push_back({x + "down_proj.weight", {h, c.shared_intermediate_size}});
      }
    } else {
      out.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, h}});
      out.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, h}});
      out.push_back({p + "mlp.down_proj.weight", {h, c.intermediate_size}});
    }
  }
  out.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, h}});
  return out;
}

ModelWeights bind_weights(const ModelConfig& c, const TensorMap& tensors) {
  std::vector<TensorSpec> specs = expected_tensors(c);
  std::set<std::string> expected;
  for (const TensorSpec& s : specs) {
    expected.insert(s.name);
    auto it = tensors.find(s.name);
    MD_REQUIRE(it != tensors.end(), "checkpoint is missing tensor ", s.name);
    const TensorView& t = it->second;
    MD_REQUIRE(t.shape == s.shape, "tensor ", s.name, " in ", t.file, " has shape ", shape_str(t.shape),
               " but the config implies ", shape_str(s.shape));
  }
  for (const auto& [name, t] : tensors) {
    // HF may store the rotary inverse frequencies; they are derived from rope_theta, not read.
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;
    if (c.model_type == "cohere2_moe" && is_zero_bias(name, t, expected)) continue;
    MD_REQUIRE(expected.count(name) != 0, "unexpected tensor ", name, " in ", t.file, " (not part of a ",
               c.model_type, " model of this config)");
  }
  auto get = [&](const std::string& name) { return tensors.at(name); };
  ModelWeights w;
  w.embed = get("model.embed_tokens.weight");
  w.final_norm = get("model.norm.weight");
  w.lm_head = c.tie_word_embeddings ? w.embed : get("lm_head.weight");
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[l];
    L.input_norm = get(p + "input_layernorm.weight");
    if (c.block == BlockKind::kSequential) L.post_attn_norm = get(p + "post_attention_layernorm.weight");
    L.q_proj = get(p + "self_attn.q_proj.weight");
    L.k_proj = get(p + "self_attn.k_proj.weight");
    L.v_proj = get(p + "self_attn.v_proj.weight");
    L.o_proj = get(p + "self_attn.o_proj.weight");
    if (c.qk_norm) {
      L.q_norm = get(p + "self_attn.q_norm.weight");
      L.k_norm = get(p + "self_attn.k_norm.weight");
    }
    if (c.is_moe_layer(l)) {
      L.router = get(p + "mlp.gate.weight");
      L.experts.resize(c.n_experts);
      for (int e = 0; e < c.n_experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        L.experts[e] = {get(x + "gate_proj.weight"), get(x + "up_proj.weight"), get(x + "down_proj.weight")};
      }
      if (c.shared_intermediate_size > 0) {
        const std::string x = p + "mlp.shared_experts.";
        L.shared = {get(x + "gate_proj.weight"), get(x + "up_proj.weight"), get(x + "down_proj.weight")};
      }
    } else {
      L.mlp_gate = get(p + "mlp.gate_proj.weight");
      L.mlp_up = get(p + "mlp.up_proj.weight");
      L.mlp_down = get(p + "mlp.down_proj.weight");
    }
  }
  return w;
}

}  // namespace megadecode
