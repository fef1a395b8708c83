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
    for (size_t i = 0; i < c.layers.size(); ++i) EXPECT_EQ(back.layers[i].ffn, c.layers[i].ffn);
  }
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

}  // namespace
}  // namespace megadecode
