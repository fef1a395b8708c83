// Tests for model/config: every field read from the file; clear errors naming the field.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "model/config.h"
#include "model/presets.h"

namespace megadecode {
namespace {

using nlohmann::json;

std::string error_of(const json& j) {
  try {
    parse_model_config(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, PresetRoundTripsThroughHfJson) {
  for (const std::string& name : preset_names()) {
    ModelConfig c = preset_config(name);
    ModelConfig back = parse_model_config(model_config_to_json(c), name);
    EXPECT_EQ(back.hidden_size, c.hidden_size);
    EXPECT_EQ(back.n_layers, c.n_layers);
    EXPECT_EQ(back.head_dim, c.head_dim);
    EXPECT_EQ(back.n_experts, c.n_experts);
    EXPECT_EQ(back.rope_theta, c.rope_theta);
    EXPECT_EQ(back.norm_topk_prob, c.norm_topk_prob);
    EXPECT_EQ(back.eos_token_ids, c.eos_token_ids);
    ASSERT_EQ(back.layers.size(), c.layers.size());
    EXPECT_EQ(back.model_type, c.model_type);
    EXPECT_EQ(back.n_kv_heads, c.n_kv_heads);
    EXPECT_EQ(back.intermediate_size, c.intermediate_size);
    EXPECT_EQ(back.moe_intermediate_size, c.moe_intermediate_size);
    EXPECT_EQ(back.n_experts_per_tok, c.n_experts_per_tok);
    EXPECT_EQ(back.rms_norm_eps, c.rms_norm_eps);
    EXPECT_EQ(back.norm, c.norm);
    EXPECT_EQ(back.block, c.block);
    EXPECT_EQ(back.router, c.router);
    EXPECT_EQ(back.rope_style, c.rope_style);
    EXPECT_EQ(back.qk_norm, c.qk_norm);
    EXPECT_EQ(back.logit_scale, c.logit_scale);
    EXPECT_EQ(back.tie_word_embeddings, c.tie_word_embeddings);
    EXPECT_EQ(back.shared_intermediate_size, c.shared_intermediate_size);
    EXPECT_EQ(back.bos_token_id, c.bos_token_id);
    ASSERT_EQ(back.layers.size(), c.layers.size());
    for (size_t i = 0; i < c.layers.size(); ++i) {
      EXPECT_EQ(back.layers[i].ffn, c.layers[i].ffn) << name << " layer " << i;
      EXPECT_EQ(back.layers[i].sliding_window, c.layers[i].sliding_window) << name << " layer " << i;
      EXPECT_EQ(back.layers[i].use_rope, c.layers[i].use_rope) << name << " layer " << i;
    }
  }
}

// North Mini Code's config.json as its published form has it (the per-layer lists given), and the
// same with the lists left to be derived from first_k_dense_replace and the window patterns.
json north_config_json() {
  json j = {{"architectures", {"Cohere2MoeForCausalLM"}},
            {"model_type", "cohere2_moe"},
            {"hidden_size", 2048},
            {"num_hidden_layers", 49},
            {"num_attention_heads", 32},
            {"num_key_value_heads", 4},
            {"head_dim", 128},
            {"vocab_size", 262144},
            {"intermediate_size", 768},
            {"prefix_dense_intermediate_size", 3072},
            {"num_experts", 128},
            {"num_experts_per_tok", 8},
            {"expert_selection_fn", "sigmoid"},
            {"norm_topk_prob", false},
            {"num_shared_experts", 0},
            {"first_k_dense_replace", 1},
            {"sliding_window", 4096},
            {"sliding_window_pattern", 4},
            {"prefix_dense_sliding_window_pattern", 1},
            {"rope_theta", 50000.0},
            {"max_position_embeddings", 500000},
            {"rms_norm_eps", 1e-6},
            {"layer_norm_eps", 1e-5},
            {"logit_scale", 1.0},
            {"tie_word_embeddings", nullptr},
            {"use_qk_norm", false},
            {"use_parallel_block", true},
            {"attention_bias", false},
            {"hidden_act", "silu"}};
  json types = json::array();
  for (int i = 0; i < 49; ++i) types.push_back(i % 4 == 0 ? "full_attention" : "sliding_attention");
  j["layer_types"] = types;
  return j;
}

TEST(ModelConfig, Cohere2MoeReadsNorthMiniCode) {
  for (const bool derived : {false, true}) {
    SCOPED_TRACE(derived ? "layer lists derived" : "layer lists given");
    json j = north_config_json();
    if (derived) j.erase("layer_types");
    const ModelConfig c = parse_model_config(j, "north");
    EXPECT_EQ(c.block, BlockKind::kParallel);
    EXPECT_EQ(c.norm, NormKind::kRms);
    EXPECT_EQ(c.router, RouterKind::kSigmoidTopK);
    EXPECT_FALSE(c.norm_topk_prob);
    EXPECT_FALSE(c.qk_norm);
    EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
    EXPECT_TRUE(c.tie_word_embeddings);  // null: transformers' default
    EXPECT_EQ(c.moe_intermediate_size, 768);
    EXPECT_EQ(c.intermediate_size, 3072);
    EXPECT_EQ(c.shared_intermediate_size, 0);
    EXPECT_EQ(c.logit_scale, 1.0f);
    ASSERT_EQ(c.layers.size(), 49u);
    int sliding = 0, nope = 0;
    for (int i = 0; i < 49; ++i) {
      const LayerSpec& L = c.layers[i];
      EXPECT_EQ(L.ffn, i == 0 ? FfnKind::kDense : FfnKind::kMoe) << i;
      EXPECT_EQ(L.sliding_window, i % 4 == 0 ? 0 : 4096) << i;
      EXPECT_EQ(L.use_rope, i == 0 || i % 4 != 0) << i;  // layer 0: full attention with RoPE
      sliding += L.sliding_window > 0;
      nope += !L.use_rope;
    }
    EXPECT_EQ(sliding, 36);
    EXPECT_EQ(nope, 12);
    const ModelConfig preset = preset_config("north-mini-code");
    for (int i = 0; i < 49; ++i) {
      EXPECT_EQ(preset.layers[i].sliding_window, c.layers[i].sliding_window) << i;
      EXPECT_EQ(preset.layers[i].use_rope, c.layers[i].use_rope) << i;
      EXPECT_EQ(preset.layers[i].ffn, c.layers[i].ffn) << i;
    }
  }
}

TEST(ModelConfig, Cohere2MoeDefaultsAndVariants) {
  json j = north_config_json();
  for (const char* f : {"logit_scale", "tie_word_embeddings", "norm_topk_prob", "expert_selection_fn",
                        "num_shared_experts", "num_key_value_heads", "prefix_dense_intermediate_size"})
    j.erase(f);
  j["norm_topk_prob"] = true;  // softmax (the default selection) needs it
  ModelConfig c = parse_model_config(j, "x");
  EXPECT_EQ(c.logit_scale, 0.0625f);  // transformers' defaults
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.router, RouterKind::kSoftmaxTopK);
  EXPECT_EQ(c.shared_intermediate_size, 0);
  EXPECT_EQ(c.n_kv_heads, 32);
  EXPECT_EQ(c.intermediate_size, 768);  // the dense prefix falls back to intermediate_size

  j = north_config_json();
  j["rms_norm_eps"] = nullptr;  // LayerNorm with layer_norm_eps
  j["num_shared_experts"] = 2;
  j["shared_expert_combination_strategy"] = "sum";
  c = parse_model_config(j, "x");
  EXPECT_EQ(c.norm, NormKind::kLayer);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.shared_intermediate_size, 2 * 768);
  EXPECT_EQ(c.shared_combine, SharedCombine::kSum);
  j.erase("shared_expert_combination_strategy");
  EXPECT_EQ(parse_model_config(j, "x").shared_combine, SharedCombine::kAverage);

  // Without layer_types and with prefix pattern 2, the dense layer 0 is sliding (pattern
  // (0 + 1) % 2 != 0); with pattern 4 on the rest, layers 4, 8, ... are full and NoPE.
  j = north_config_json();
  j.erase("layer_types");
  j["prefix_dense_sliding_window_pattern"] = 2;
  c = parse_model_config(j, "x");
  EXPECT_EQ(c.layers[0].sliding_window, 4096);
  EXPECT_TRUE(c.layers[0].use_rope);
  EXPECT_EQ(c.layers[4].sliding_window, 0);
  EXPECT_FALSE(c.layers[4].use_rope);
  // A full dense layer gets RoPE only with prefix pattern 1.
  j = north_config_json();
  j["prefix_dense_sliding_window_pattern"] = 3;
  EXPECT_FALSE(parse_model_config(j, "x").layers[0].use_rope);
  // mlp_layer_types wins over first_k_dense_replace.
  j = north_config_json();
  json mlp = json::array();
  for (int i = 0; i < 49; ++i) mlp.push_back(i < 2 ? "dense" : "sparse");
  j["mlp_layer_types"] = mlp;
  c = parse_model_config(j, "x");
  EXPECT_EQ(c.layers[1].ffn, FfnKind::kDense);
  EXPECT_EQ(c.layers[2].ffn, FfnKind::kMoe);
}

TEST(ModelConfig, Cohere2MoeRefusesWhatItCannotHonour) {
  struct Case {
    const char* field;
    json value;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"use_qk_norm", true, "use_qk_norm"},
      {"use_parallel_block", false, "use_parallel_block"},
      {"expert_selection_fn", "tanh", "expert_selection_fn"},
      {"shared_expert_combination_strategy", "max", "shared_expert_combination_strategy"},
      {"hidden_act", "gelu", "hidden_act"},
      {"attention_bias", true, "attention_bias"},
      {"num_nextn_predict_layers", 1, "num_nextn_predict_layers"},
      {"logit_scale", 0.0, "logit_scale"},
      {"layer_types", json::array({"full_attention"}), "layer_types"},
      {"mlp_layer_types", json::array({"dense"}), "mlp_layer_types"},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}, "rope_scaling"},
      {"sliding_window", nullptr, "sliding_window"},
      {"intermediate_size", nullptr, "intermediate_size"},
      {"num_experts", nullptr, "num_experts"},
  };
  for (const Case& k : cases) {
    json j = north_config_json();
    j[k.field] = k.value;
    const std::string err = error_of(j);
    EXPECT_NE(err.find(k.message), std::string::npos) << k.field << ": " << err;
  }
  json j = north_config_json();
  j["layer_types"][3] = "chunked_attention";
  EXPECT_NE(error_of(j).find("layer_types[3]"), std::string::npos) << error_of(j);
  j = north_config_json();
  j["expert_selection_fn"] = "softmax";
  EXPECT_NE(error_of(j).find("disagree"), std::string::npos) << error_of(j);
  j = north_config_json();
  j["rms_norm_eps"] = nullptr;
  j.erase("layer_norm_eps");
  EXPECT_NE(error_of(j).find("layer_norm_eps"), std::string::npos) << error_of(j);
}

TEST(ModelConfig, ReadsValuesThatDifferBetweenCheckpoints) {
  json j = model_config_to_json(preset_config("qwen3-30b-a3b"));
  j["rope_theta"] = 1e7;
  j["norm_topk_prob"] = false;
  ModelConfig c = parse_model_config(j, "x");
  EXPECT_EQ(c.rope_theta, 1e7);
  EXPECT_FALSE(c.norm_topk_prob);
  // transformers 5 style rope_parameters
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e6}};
  EXPECT_EQ(parse_model_config(j, "x").rope_theta, 5e6);
}

TEST(ModelConfig, MissingFieldsAreNamed) {
  json base = model_config_to_json(preset_config("tiny"));
  for (const char* f : {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                        "vocab_size", "rms_norm_eps", "rope_theta", "num_experts", "num_experts_per_tok",
                        "moe_intermediate_size", "norm_topk_prob", "tie_word_embeddings", "decoder_sparse_step",
                        "mlp_only_layers", "max_position_embeddings", "intermediate_size", "model_type"}) {
    json j = base;
    j.erase(f);
    std::string err = error_of(j);
    EXPECT_NE(err.find(f), std::string::npos) << f << ": " << err;
  }
}

TEST(ModelConfig, RejectsBadValues) {
  json base = model_config_to_json(preset_config("tiny"));
  json j = base;
  j["model_type"] = "llama";
  EXPECT_NE(error_of(j).find("unsupported model_type"), std::string::npos);
  j = base;
  j["hidden_size"] = "2048";
  EXPECT_NE(error_of(j).find("hidden_size"), std::string::npos);
  j = base;
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("multiple"), std::string::npos);
  j = base;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(error_of(j).find("rope_scaling"), std::string::npos);
  j = base;
  j["num_experts_per_tok"] = 99;
  EXPECT_NE(error_of(j).find("exceeds"), std::string::npos);
  EXPECT_NE(error_of(json::array()).find("object"), std::string::npos);
}

TEST(ModelConfig, DenseLayersFromMlpOnlyAndSparseStep) {
  json j = model_config_to_json(preset_config("tiny"));
  j["mlp_only_layers"] = {1};
  ModelConfig c = parse_model_config(j, "x");
  EXPECT_EQ(c.layers[0].ffn, FfnKind::kMoe);
  EXPECT_EQ(c.layers[1].ffn, FfnKind::kDense);
  j["mlp_only_layers"] = json::array();
  j["decoder_sparse_step"] = 2;
  c = parse_model_config(j, "x");
  EXPECT_EQ(c.layers[0].ffn, FfnKind::kDense);
  EXPECT_EQ(c.layers[1].ffn, FfnKind::kMoe);
}

// The FFN activation width a token needs (the batched step's and prefill's scratch): the largest
// layer's, K experts' plus the shared experts', or the dense MLP's.
TEST(ModelConfig, FfnActivationWidthIsTheLargestLayers) {
  EXPECT_EQ(preset_config("qwen3-30b-a3b").ffn_act_per_token(), 8 * 768);
  EXPECT_EQ(preset_config("north-mini-code").ffn_act_per_token(), 8 * 768);  // > the dense layer's 3072
  ModelConfig c = preset_config("north-tiny");
  EXPECT_EQ(c.ffn_act_per_token(), 4 * 64);
  c.intermediate_size = 1000;  // the dense layer 0 the widest
  EXPECT_EQ(c.ffn_act_per_token(), 1000);
  c.shared_intermediate_size = 2 * 64 * 8;
  EXPECT_EQ(c.ffn_act_per_token(), 4 * 64 + 2 * 64 * 8);
  EXPECT_EQ(c.n_sliding_layers(), 3);
}

}  // namespace
}  // namespace megadecode
