#include "model/config.h"

#include <algorithm>
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

}  // namespace

ModelConfig parse_model_config(const json& j, const std::string& source) {
  MD_REQUIRE(j.is_object(), source, ": config must be a JSON object");
  ModelConfig c;
  const json& type = field(j, "model_type", source);
  MD_REQUIRE(type.is_string(), source, ": field \"model_type\" must be a string");
  c.model_type = type.get<std::string>();
  MD_REQUIRE(c.model_type == "qwen3_moe" || c.model_type == "qwen3", source, ": unsupported model_type \"",
             c.model_type, "\" (supported: qwen3_moe, qwen3)");

  c.hidden_size = int_field(j, "hidden_size", source, 1);
  c.n_layers = int_field(j, "num_hidden_layers", source, 1);
  c.n_heads = int_field(j, "num_attention_heads", source, 1);
  c.n_kv_heads = int_field(j, "num_key_value_heads", source, 1);
  c.head_dim = int_field(j, "head_dim", source, 2);
  c.vocab_size = int_field(j, "vocab_size", source, 1);
  c.max_position_embeddings = int_field(j, "max_position_embeddings", source, 1);
  c.rms_norm_eps = static_cast<float>(number_field(j, "rms_norm_eps", source));
  c.rope_theta = rope_theta_of(j, source);
  c.tie_word_embeddings = bool_field(j, "tie_word_embeddings", source);
  c.intermediate_size = int_field(j, "intermediate_size", source, 0);
  c.rope_style = RopeStyle::kNeox;
  c.qk_norm = true;
  c.block = BlockKind::kSequential;
  c.router = RouterKind::kSoftmaxTopK;

  MD_REQUIRE(c.n_heads % c.n_kv_heads == 0, source, ": num_attention_heads (", c.n_heads,
             ") must be a multiple of num_key_value_heads (", c.n_kv_heads, ")");
  MD_REQUIRE(c.head_dim % 2 == 0, source, ": head_dim must be even, got ", c.head_dim);
  MD_REQUIRE(c.rms_norm_eps > 0.0f, source, ": rms_norm_eps must be positive");
  MD_REQUIRE(c.rope_theta > 0.0, source, ": rope_theta must be positive");
  MD_REQUIRE(!optional_bool(j, "attention_bias", source), source, ": attention_bias=true is not supported");
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
    MD_REQUIRE(c.n_experts_per_tok <= c.n_experts, source, ": num_experts_per_tok (", c.n_experts_per_tok,
               ") exceeds num_experts (", c.n_experts, ")");
    auto shared = j.find("shared_expert_intermediate_size");
    MD_REQUIRE(shared == j.end() || shared->is_null() || (shared->is_number_integer() && shared->get<int>() == 0),
               source, ": shared experts are not supported");
  }
  c.layers.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    bool dense = c.model_type == "qwen3" || std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end() ||
                 (i + 1) % sparse_step != 0;
    c.layers[i].ffn = dense ? FfnKind::kDense : FfnKind::kMoe;
    if (dense) {
      MD_REQUIRE(c.intermediate_size > 0, source, ": layer ", i, " is dense but intermediate_size is 0");
    }
  }
  if (auto it = j.find("eos_token_id"); it != j.end()) c.eos_token_ids = token_ids(*it, "eos_token_id", source);
  if (auto it = j.find("bos_token_id"); it != j.end() && it->is_number_integer()) c.bos_token_id = it->get<int>();
  if (auto it = j.find("torch_dtype"); it != j.end() && it->is_string()) c.torch_dtype = it->get<std::string>();
  if (auto it = j.find("dtype"); c.torch_dtype.empty() && it != j.end() && it->is_string()) {
    c.torch_dtype = it->get<std::string>();
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

json model_config_to_json(const ModelConfig& c) {
  MD_CHECK(c.block == BlockKind::kSequential && c.router == RouterKind::kSoftmaxTopK && c.qk_norm &&
           c.rope_style == RopeStyle::kNeox);
  json j;
  bool moe = c.model_type == "qwen3_moe";
  j["architectures"] = {moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"};
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
  j["torch_dtype"] = c.torch_dtype.empty() ? "bfloat16" : c.torch_dtype;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids;
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
