#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace megadecode {
namespace {

using nlohmann::json;

const json& field(const json& j, const char* name, const std::string& source) {
  auto it = j.find(name);
  MD_REQUIRE(it != j.end() && !it->is_null(), source, ": missing field \"", name, "\"");
  return *it;
}

int int_field(const json& j, const char* name, const std::string& source, int min_value) {
  const json& v = field(j, name, source);
  MD_REQUIRE(v.is_number_integer(), source, ": field \"", name, "\" must be an integer, got ", v.dump());
  int64_t x = v.get<int64_t>();
  MD_REQUIRE(x >= min_value && x <= (int64_t{1} << 30), source, ": field \"", name, "\" out of range: ", x);
  return static_cast<int>(x);
}

double number_field(const json& j, const char* name, const std::string& source) {
  const json& v = field(j, name, source);
  MD_REQUIRE(v.is_number(), source, ": field \"", name, "\" must be a number, got ", v.dump());
  return v.get<double>();
}

bool bool_field(const json& j, const char* name, const std::string& source) {
  const json& v = field(j, name, source);
  MD_REQUIRE(v.is_boolean(), source, ": field \"", name, "\" must be true or false, got ", v.dump());
  return v.get<bool>();
}

// An optional flag whose absence means what HF's absence means (false); present, it must be a bool.
bool optional_bool(const json& j, const char* name, const std::string& source) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return false;
  MD_REQUIRE(it->is_boolean(), source, ": field \"", name, "\" must be true or false, got ", it->dump());
  return it->get<bool>();
}

std::vector<int> token_ids(const json& v, const char* name, const std::string& source) {
  std::vector<int> out;
  if (v.is_null()) return out;
  if (v.is_number_integer()) return {v.get<int>()};
  MD_REQUIRE(v.is_array(), source, ": field \"", name, "\" must be an integer or a list of integers");
  for (const json& x : v) {
    MD_REQUIRE(x.is_number_integer(), source, ": field \"", name, "\" must hold integers");
    out.push_back(x.get<int>());
  }
  return out;
}

double rope_theta_of(const json& j, const std::string& source) {
  // transformers 5 writes rope_parameters {rope_type, rope_theta}; older files a top-level rope_theta.
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {
    auto type = it->find("rope_type");
    MD_REQUIRE(type == it->end() || (type->is_string() && type->get<std::string>() == "default"), source,
               ": rope_parameters.rope_type ", type == it->end() ? "" : type->dump(), " is not supported (only default)");
    return number_field(*it, "rope_theta", source + " rope_parameters");
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    auto type = it->find("rope_type");
    if (type == it->end()) type = it->find("type");
    bool is_default = type != it->end() && type->is_string() && type->get<std::string>() == "default";
    MD_REQUIRE(is_default, source, ": rope_scaling ", it->dump(), " is not supported (YaRN and others are not implemented)");
  }
  return number_field(j, "rope_theta", source);
}

// An optional field: absent or null gives `absent`; present, it must be of the kind `get` reads.
std::string optional_string(const json& j, const char* name, const std::string& source, const std::string& absent) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return absent;
  MD_REQUIRE(it->is_string(), source, ": field \"", name, "\" must be a string, got ", it->dump());
  return it->get<std::string>();
}

bool bool_or(const json& j, const char* name, const std::string& source, bool absent) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return absent;
  return bool_field(j, name, source);
}

int int_or(const json& j, const char* name, const std::string& source, int min_value, int absent) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return absent;
  return int_field(j, name, source, min_value);
}

std::vector<std::string> string_list(const json& j, const char* name, const std::string& source, int n) {
  const json& v = field(j, name, source);
  MD_REQUIRE(v.is_array() && static_cast<int>(v.size()) == n, source, ": field \"", name, "\" must be a list of ", n,
             " strings (one per layer), got ", v.dump());
  std::vector<std::string> out;
  for (const json& x : v) {
    MD_REQUIRE(x.is_string(), source, ": field \"", name, "\" must hold strings, got ", x.dump());
    out.push_back(x.get<std::string>());
  }
  return out;
}

// The fields both families read the same way.
void parse_common(const json& j, const std::string& source, ModelConfig& c) {
  c.hidden_size = int_field(j, "hidden_size", source, 1);
  c.n_layers = int_field(j, "num_hidden_layers", source, 1);
  c.n_heads = int_field(j, "num_attention_heads", source, 1);
  c.head_dim = int_field(j, "head_dim", source, 2);
  c.vocab_size = int_field(j, "vocab_size", source, 1);
  c.max_position_embeddings = int_field(j, "max_position_embeddings", source, 1);
  c.rope_theta = rope_theta_of(j, source);
  MD_REQUIRE(c.head_dim % 2 == 0, source, ": head_dim must be even, got ", c.head_dim);
  MD_REQUIRE(c.rope_theta > 0.0, source, ": rope_theta must be positive");
  MD_REQUIRE(!optional_bool(j, "attention_bias", source), source, ": attention_bias=true is not supported");
  const std::string act = optional_string(j, "hidden_act", source, "silu");
  MD_REQUIRE(act == "silu", source, ": hidden_act \"", act, "\" is not supported (only silu)");
  if (auto it = j.find("eos_token_id"); it != j.end()) c.eos_token_ids = token_ids(*it, "eos_token_id", source);
  if (auto it = j.find("bos_token_id"); it != j.end() && it->is_number_integer()) c.bos_token_id = it->get<int>();
  if (auto it = j.find("torch_dtype"); it != j.end() && it->is_string()) c.torch_dtype = it->get<std::string>();
  if (auto it = j.find("dtype"); c.torch_dtype.empty() && it != j.end() && it->is_string()) {
    c.torch_dtype = it->get<std::string>();
  }
}

void check_heads(const ModelConfig& c, const std::string& source) {
  MD_REQUIRE(c.n_heads % c.n_kv_heads == 0, source, ": num_attention_heads (", c.n_heads,
             ") must be a multiple of num_key_value_heads (", c.n_kv_heads, ")");
  MD_REQUIRE(c.rms_norm_eps > 0.0f, source, ": the norm epsilon must be positive");
  MD_REQUIRE(c.n_experts_per_tok <= c.n_experts, source, ": num_experts_per_tok (", c.n_experts_per_tok,
             ") exceeds num_experts (", c.n_experts, ")");
}

void parse_qwen3(const json& j, const std::string& source, ModelConfig& c) {
  c.n_kv_heads = int_field(j, "num_key_value_heads", source, 1);
  c.rms_norm_eps = static_cast<float>(number_field(j, "rms_norm_eps", source));
  c.tie_word_embeddings = bool_field(j, "tie_word_embeddings", source);
  c.intermediate_size = int_field(j, "intermediate_size", source, 0);
  c.rope_style = RopeStyle::kNeox;
  c.qk_norm = true;
  c.block = BlockKind::kSequential;
  c.router = RouterKind::kSoftmaxTopK;
  MD_REQUIRE(!optional_bool(j, "use_sliding_window", source), source, ": use_sliding_window=true is not supported");

  std::vector<int> mlp_only;
  int sparse_step = 1;
  if (c.model_type == "qwen3_moe") {
    c.n_experts = int_field(j, "num_experts", source, 1);
    c.n_experts_per_tok = int_field(j, "num_experts_per_tok", source, 1);
    c.moe_intermediate_size = int_field(j, "moe_intermediate_size", source, 1);
    c.norm_topk_prob = bool_field(j, "norm_topk_prob", source);
    sparse_step = int_field(j, "decoder_sparse_step", source, 1);
    const json& m = field(j, "mlp_only_layers", source);
    mlp_only = token_ids(m, "mlp_only_layers", source);
    auto shared = j.find("shared_expert_intermediate_size");
    MD_REQUIRE(shared == j.end() || shared->is_null() || (shared->is_number_integer() && shared->get<int>() == 0),
               source, ": shared experts are not supported");
  }
  check_heads(c, source);
  c.layers.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    bool dense = c.model_type == "qwen3" || std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end() ||
                 (i + 1) % sparse_step != 0;
    c.layers[i].ffn = dense ? FfnKind::kDense : FfnKind::kMoe;
    if (dense) {
      MD_REQUIRE(c.intermediate_size > 0, source, ": layer ", i, " is dense but intermediate_size is 0");
    }
  }
}

// transformers' Cohere2MoeConfig and modeling_cohere2_moe, field by field (defaults are its defaults).
void parse_cohere2_moe(const json& j, const std::string& source, ModelConfig& c) {
  c.n_kv_heads = int_or(j, "num_key_value_heads", source, 1, c.n_heads);
  c.tie_word_embeddings = bool_or(j, "tie_word_embeddings", source, true);
  if (auto it = j.find("logit_scale"); it != j.end() && !it->is_null()) {
    c.logit_scale = static_cast<float>(number_field(j, "logit_scale", source));
  } else {
    c.logit_scale = 0.0625f;
  }
  MD_REQUIRE(std::isfinite(c.logit_scale) && c.logit_scale != 0.0f, source, ": logit_scale must be finite and non-zero");
  // RMSNorm when rms_norm_eps is given, else LayerNorm (weight only) with layer_norm_eps.
  if (auto it = j.find("rms_norm_eps"); it != j.end() && !it->is_null()) {
    c.norm = NormKind::kRms;
    c.rms_norm_eps = static_cast<float>(number_field(j, "rms_norm_eps", source));
  } else {
    c.norm = NormKind::kLayer;
    c.rms_norm_eps = static_cast<float>(number_field(j, "layer_norm_eps", source));
  }
  c.rope_style = RopeStyle::kInterleaved;
  c.qk_norm = false;
  c.block = BlockKind::kParallel;
  MD_REQUIRE(!optional_bool(j, "use_qk_norm", source), source,
             ": use_qk_norm=true is not supported (cohere2_moe has no q/k norm in transformers or vLLM)");
  MD_REQUIRE(bool_or(j, "use_parallel_block", source, true), source,
             ": use_parallel_block=false is not supported (cohere2_moe blocks are parallel)");
  MD_REQUIRE(int_or(j, "num_nextn_predict_layers", source, 0, 0) == 0, source,
             ": num_nextn_predict_layers (multi-token prediction layers) is not supported");

  // The routed experts' width is "intermediate_size"; the dense prefix's is its own field.
  c.moe_intermediate_size = int_field(j, "intermediate_size", source, 1);
  c.intermediate_size = int_or(j, "prefix_dense_intermediate_size", source, 1, c.moe_intermediate_size);
  c.n_experts = int_field(j, "num_experts", source, 1);
  c.n_experts_per_tok = int_field(j, "num_experts_per_tok", source, 1);
  c.norm_topk_prob = bool_or(j, "norm_topk_prob", source, true);
  const std::string selection = optional_string(j, "expert_selection_fn", source, "softmax");
  if (selection == "sigmoid") {
    c.router = RouterKind::kSigmoidTopK;
  } else {
    MD_REQUIRE(selection == "softmax", source, ": expert_selection_fn \"", selection,
               "\" is not supported (sigmoid or softmax)");
    // transformers takes the softmax over the k chosen logits whatever norm_topk_prob says; vLLM
    // renormalises only when it is true. The two agree only then.
    MD_REQUIRE(c.norm_topk_prob, source,
               ": expert_selection_fn softmax with norm_topk_prob=false is not supported (transformers and vLLM "
               "disagree on its meaning)");
    c.router = RouterKind::kSoftmaxTopK;
  }
  const int n_shared = int_or(j, "num_shared_experts", source, 0, 0);
  c.shared_intermediate_size = n_shared * c.moe_intermediate_size;
  const std::string combine = optional_string(j, "shared_expert_combination_strategy", source, "average");
  MD_REQUIRE(combine == "average" || combine == "sum", source, ": shared_expert_combination_strategy \"", combine,
             "\" is not supported (average or sum)");
  c.shared_combine = combine == "sum" ? SharedCombine::kSum : SharedCombine::kAverage;
  check_heads(c, source);

  // Dense or sparse FFN per layer: mlp_layer_types, else the first first_k_dense_replace dense.
  const int first_dense = int_or(j, "first_k_dense_replace", source, 0, 0);
  std::vector<std::string> mlp_types;
  if (auto it = j.find("mlp_layer_types"); it != j.end() && !it->is_null()) {
    mlp_types = string_list(j, "mlp_layer_types", source, c.n_layers);
  } else {
    for (int i = 0; i < c.n_layers; ++i) mlp_types.push_back(i < first_dense ? "dense" : "sparse");
  }
  // Sliding or full attention per layer: layer_types, else the patterns (the dense prefix by its own).
  const int pattern = int_or(j, "sliding_window_pattern", source, 1, 4);
  const int prefix_pattern = int_or(j, "prefix_dense_sliding_window_pattern", source, 1, 1);
  std::vector<std::string> attn_types;
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    attn_types = string_list(j, "layer_types", source, c.n_layers);
  } else {
    const int prefix = std::min(first_dense, c.n_layers);
    for (int i = 0; i < prefix; ++i) attn_types.push_back((i + 1) % prefix_pattern != 0 ? "sliding_attention" : "full_attention");
    for (int i = 0; i < c.n_layers - prefix; ++i)
      attn_types.push_back((i + 1) % pattern != 0 ? "sliding_attention" : "full_attention");
  }
  const bool any_sliding = std::find(attn_types.begin(), attn_types.end(), "sliding_attention") != attn_types.end();
  const int window = any_sliding ? int_field(j, "sliding_window", source, 1) : 0;
  c.layers.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string& m = mlp_types[i];
    MD_REQUIRE(m == "dense" || m == "sparse", source, ": mlp_layer_types[", i, "] \"", m, "\" is not dense or sparse");
    const std::string& a = attn_types[i];
    MD_REQUIRE(a == "sliding_attention" || a == "full_attention", source, ": layer_types[", i, "] \"", a,
               "\" is not sliding_attention or full_attention");
    LayerSpec& L = c.layers[i];
    L.ffn = m == "dense" ? FfnKind::kDense : FfnKind::kMoe;
    L.sliding_window = a == "sliding_attention" ? window : 0;
    // RoPE on sliding layers; a full layer has none unless it is a dense layer and the dense
    // prefix's pattern is 1 (transformers' force_rope).
    L.use_rope = a == "sliding_attention" || (m == "dense" && prefix_pattern == 1);
  }
}

}  // namespace

ModelConfig parse_model_config(const json& j, const std::string& source) {
  MD_REQUIRE(j.is_object(), source, ": config must be a JSON object");
  ModelConfig c;
  const json& type = field(j, "model_type", source);
  MD_REQUIRE(type.is_string(), source, ": field \"model_type\" must be a string");
  c.model_type = type.get<std::string>();
  MD_REQUIRE(c.model_type == "qwen3_moe" || c.model_type == "qwen3" || c.model_type == "cohere2_moe", source,
             ": unsupported model_type \"", c.model_type, "\" (supported: qwen3_moe, qwen3, cohere2_moe)");
  parse_common(j, source, c);
  if (c.model_type == "cohere2_moe") {
    parse_cohere2_moe(j, source, c);
  } else {
    parse_qwen3(j, source, c);
  }
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  std::filesystem::path path = model_dir / "config.json";
  std::ifstream in(path);
  MD_REQUIRE(in.good(), "cannot open ", path.string());
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  MD_REQUIRE(!j.is_discarded(), path.string(), ": malformed JSON");
  return parse_model_config(j, path.string());
}

namespace {

void put_token_ids(const ModelConfig& c, json& j) {
  j["torch_dtype"] = c.torch_dtype.empty() ? "bfloat16" : c.torch_dtype;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids;
}

// The fields both families write alike: the type, the attention shape, the vocabulary.
void put_shape(const ModelConfig& c, json& j) {
  j["model_type"] = c.model_type;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
}

// What Cohere2MoeConfig writes, with the per-layer lists spelled out (so nothing is derived).
json cohere2_moe_to_json(const ModelConfig& c) {
  MD_CHECK(c.block == BlockKind::kParallel && !c.qk_norm && c.rope_style == RopeStyle::kInterleaved);
  MD_CHECK(c.router == RouterKind::kSigmoidTopK || c.norm_topk_prob);
  MD_CHECK(c.shared_intermediate_size % c.moe_intermediate_size == 0);
  json j;
  j["architectures"] = {"Cohere2MoeForCausalLM"};
  put_shape(c, j);
  if (c.norm == NormKind::kRms) {
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["layer_norm_eps"] = 1e-5;
  } else {
    j["rms_norm_eps"] = nullptr;
    j["layer_norm_eps"] = c.rms_norm_eps;
  }
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["logit_scale"] = c.logit_scale;
  j["use_qk_norm"] = false;
  j["use_parallel_block"] = true;
  j["intermediate_size"] = c.moe_intermediate_size;
  j["prefix_dense_intermediate_size"] = c.intermediate_size;
  j["num_experts"] = c.n_experts;
  j["num_experts_per_tok"] = c.n_experts_per_tok;
  j["expert_selection_fn"] = c.router == RouterKind::kSigmoidTopK ? "sigmoid" : "softmax";
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["num_shared_experts"] = c.shared_intermediate_size / c.moe_intermediate_size;
  j["shared_expert_combination_strategy"] = c.shared_combine == SharedCombine::kSum ? "sum" : "average";
  json mlp_types = json::array(), attn_types = json::array();
  int window = 0, first_dense = 0;
  bool dense_full_rope = true;
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerSpec& L = c.layers[i];
    mlp_types.push_back(L.ffn == FfnKind::kDense ? "dense" : "sparse");
    attn_types.push_back(L.sliding_window > 0 ? "sliding_attention" : "full_attention");
    if (L.ffn == FfnKind::kDense && first_dense == i) ++first_dense;
    if (L.sliding_window > 0) {
      MD_CHECK(window == 0 || window == L.sliding_window);  // one window for every sliding layer
      MD_CHECK(L.use_rope);
      window = L.sliding_window;
    } else if (L.ffn == FfnKind::kMoe) {
      MD_CHECK(!L.use_rope);  // a full sparse layer has no position encoding
    }
  }
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerSpec& L = c.layers[i];
    if (L.sliding_window == 0 && L.ffn == FfnKind::kDense) dense_full_rope = L.use_rope;
  }
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerSpec& L = c.layers[i];
    if (L.sliding_window == 0 && L.ffn == FfnKind::kDense) MD_CHECK(L.use_rope == dense_full_rope);
  }
  j["mlp_layer_types"] = mlp_types;
  j["layer_types"] = attn_types;
  j["first_k_dense_replace"] = first_dense;
  j["sliding_window"] = window > 0 ? json(window) : json(nullptr);
  j["sliding_window_pattern"] = 4;
  // Read only for force_rope once layer_types is given: 1 puts RoPE on full dense layers.
  j["prefix_dense_sliding_window_pattern"] = dense_full_rope ? 1 : 4;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  put_token_ids(c, j);
  return j;
}

}  // namespace

json model_config_to_json(const ModelConfig& c) {
  if (c.model_type == "cohere2_moe") return cohere2_moe_to_json(c);
  MD_CHECK(c.block == BlockKind::kSequential && c.router == RouterKind::kSoftmaxTopK && c.qk_norm &&
           c.rope_style == RopeStyle::kNeox && c.norm == NormKind::kRms && c.logit_scale == 1.0f &&
           c.shared_intermediate_size == 0);
  json j;
  bool moe = c.model_type == "qwen3_moe";
  j["architectures"] = {moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"};
  put_shape(c, j);
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["intermediate_size"] = c.intermediate_size;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = c.n_layers;
  put_token_ids(c, j);
  if (moe) {
    j["num_experts"] = c.n_experts;
    j["num_experts_per_tok"] = c.n_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = 1;
    json mlp_only = json::array();
    for (int i = 0; i < c.n_layers; ++i) {
      if (c.layers[i].ffn == FfnKind::kDense) mlp_only.push_back(i);
    }
    j["mlp_only_layers"] = mlp_only;
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = 0.001;
  }
  return j;
}

}  // namespace megadecode
