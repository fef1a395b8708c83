// bind_weights and expected_tensors: every tensor the config implies, bound by name; missing,
// unexpected and misshapen tensors are Errors naming the tensor.
#include <gtest/gtest.h>

#include <cstring>

#include <nlohmann/json.hpp>

#include "model/presets.h"
#include "model/synthetic.h"
#include "model/weights.h"

namespace megadecode {
namespace {

std::string bind_error(const ModelConfig& c, const TensorMap& tensors) {
  try {
    bind_weights(c, tensors);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class BindTiny : public ::testing::Test {
 protected:
  ModelConfig config_ = preset_config("tiny");
  std::unique_ptr<TensorStore> store_ = make_synthetic_tensors(config_, 3);
  TensorMap tensors_ = store_->tensors();
};

TEST_F(BindTiny, BindsEveryTensorByName) {
  ModelWeights w = bind_weights(config_, tensors_);
  ASSERT_EQ(w.layers.size(), 3u);
  EXPECT_EQ(w.embed.data, tensors_.at("model.embed_tokens.weight").data);
  EXPECT_EQ(w.lm_head.data, tensors_.at("lm_head.weight").data);
  EXPECT_EQ(w.final_norm.data, tensors_.at("model.norm.weight").data);
  const LayerWeights& l1 = w.layers[1];
  EXPECT_EQ(l1.o_proj.data, tensors_.at("model.layers.1.self_attn.o_proj.weight").data);
  EXPECT_EQ(l1.k_norm.data, tensors_.at("model.layers.1.self_attn.k_norm.weight").data);
  EXPECT_EQ(l1.router.data, tensors_.at("model.layers.1.mlp.gate.weight").data);
  ASSERT_EQ(l1.experts.size(), 16u);
  EXPECT_EQ(l1.experts[13].up.data, tensors_.at("model.layers.1.mlp.experts.13.up_proj.weight").data);
  EXPECT_EQ(l1.experts[13].down.shape, (std::vector<int64_t>{128, 64}));
}

TEST_F(BindTiny, MissingTensorIsNamed) {
  tensors_.erase("model.layers.2.mlp.experts.15.down_proj.weight");
  std::string err = bind_error(config_, tensors_);
  EXPECT_NE(err.find("missing"), std::string::npos) << err;
  EXPECT_NE(err.find("model.layers.2.mlp.experts.15.down_proj.weight"), std::string::npos) << err;
}

TEST_F(BindTiny, UnexpectedTensorIsNamed) {
  TensorView extra = tensors_.at("model.norm.weight");
  extra.name = "model.layers.3.input_layernorm.weight";
  tensors_[extra.name] = extra;
  std::string err = bind_error(config_, tensors_);
  EXPECT_NE(err.find("unexpected"), std::string::npos) << err;
  EXPECT_NE(err.find("model.layers.3.input_layernorm.weight"), std::string::npos) << err;
}

TEST_F(BindTiny, WrongShapeIsNamedWithBothShapes) {
  tensors_.at("model.layers.0.self_attn.k_proj.weight").shape = {128, 64};
  std::string err = bind_error(config_, tensors_);
  EXPECT_NE(err.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("[128, 64]"), std::string::npos) << err;
  EXPECT_NE(err.find("[64, 128]"), std::string::npos) << err;
}

TEST_F(BindTiny, RotaryInverseFrequenciesAreIgnored) {
  TensorView inv = tensors_.at("model.norm.weight");
  inv.name = "model.layers.0.self_attn.rotary_emb.inv_freq";
  tensors_[inv.name] = inv;
  EXPECT_EQ(bind_error(config_, tensors_), "");
}

TEST(ExpectedTensors, FullModelCountAndOrder) {
  const ModelConfig c = preset_config("qwen3-30b-a3b");
  std::vector<TensorSpec> specs = expected_tensors(c);
  // embed + 48 layers x (2 norms + 4 projections + 2 qk norms + router + 128 x 3 experts) + norm + lm_head
  EXPECT_EQ(specs.size(), 1u + 48u * (2 + 4 + 2 + 1 + 128 * 3) + 2u);
  EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  size_t params = 0;
  for (const TensorSpec& s : specs) {
    size_t n = 1;
    for (int64_t d : s.shape) n *= static_cast<size_t>(d);
    params += n;
  }
  EXPECT_EQ(params, 30532122624u);  // Qwen3-30B-A3B's parameter count
}

TEST(ExpectedTensors, DenseLayersAndTiedEmbeddings) {
  ModelConfig c = preset_config("tiny");
  c.layers[0].ffn = FfnKind::kDense;
  c.tie_word_embeddings = true;
  std::unique_ptr<TensorStore> store = make_synthetic_tensors(c, 1);
  EXPECT_EQ(store->tensors().count("model.layers.0.mlp.gate_proj.weight"), 1u);
  EXPECT_EQ(store->tensors().count("model.layers.0.mlp.gate.weight"), 0u);
  EXPECT_EQ(store->tensors().count("lm_head.weight"), 0u);
  ModelWeights w = bind_weights(c, store->tensors());
  EXPECT_EQ(w.lm_head.data, w.embed.data);
  EXPECT_EQ(w.layers[0].mlp_down.shape, (std::vector<int64_t>{128, 256}));
  EXPECT_TRUE(w.layers[0].experts.empty());
  EXPECT_EQ(w.layers[1].experts.size(), 16u);
}

TEST(ExpectedTensors, NorthMiniCodeCountAndParameters) {
  const ModelConfig c = preset_config("north-mini-code");
  const std::vector<TensorSpec> specs = expected_tensors(c);
  // embed + 49 x (1 norm + 4 projections) + layer 0's 3 dense + 48 x (router + 128 x 3) + norm;
  // no post-attention norm (parallel blocks), no q/k norms, no lm_head (tied).
  EXPECT_EQ(specs.size(), 1u + 49u * 5 + 3u + 48u * (1 + 128 * 3) + 1u);
  size_t params = 0;
  for (const TensorSpec& s : specs) {
    size_t n = 1;
    for (int64_t d : s.shape) n *= static_cast<size_t>(d);
    params += n;
    EXPECT_EQ(s.name.find("post_attention_layernorm"), std::string::npos) << s.name;
    EXPECT_EQ(s.name.find("q_norm"), std::string::npos) << s.name;
  }
  EXPECT_EQ(specs.back().name, "model.norm.weight");
  EXPECT_EQ(params, 30484303872u);  // the "30B-A3B" North Mini Code: 30.48 B
}

class BindNorth : public ::testing::Test {
 protected:
  ModelConfig config_ = with_shared(preset_config("north-tiny"));
  std::unique_ptr<TensorStore> store_ = make_synthetic_tensors(config_, 5);
  TensorMap tensors_ = store_->tensors();
  TensorStore biases_;

  static ModelConfig with_shared(ModelConfig c) {
    c.shared_intermediate_size = 2 * c.moe_intermediate_size;
    return c;
  }
  // A ".bias" for `weight`, of the weight's first dimension, all zero or with one element set.
  void add_bias(const std::string& weight, float value) {
    const std::string name = weight.substr(0, weight.size() - std::string(".weight").size()) + ".bias";
    const int64_t n = tensors_.at(weight).shape[0];
    std::byte* p = biases_.add(name, Dtype::kBF16, {n});
    const uint16_t b = float_to_bf16_bits(value);
    std::memcpy(p + 2 * (n - 1), &b, 2);
    tensors_[name] = biases_.tensors().at(name);
  }
};

TEST_F(BindNorth, BindsSharedExpertsAndTiedEmbeddingsWithoutAPostAttentionNorm) {
  const ModelWeights w = bind_weights(config_, tensors_);
  EXPECT_EQ(w.lm_head.data, w.embed.data);
  EXPECT_EQ(tensors_.count("model.layers.1.post_attention_layernorm.weight"), 0u);
  EXPECT_EQ(w.layers[1].post_attn_norm.data, nullptr);
  EXPECT_EQ(w.layers[2].shared.down.data, tensors_.at("model.layers.2.mlp.shared_experts.down_proj.weight").data);
  EXPECT_EQ(w.layers[2].shared.gate.shape, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(w.layers[0].shared.gate.data, nullptr);  // the dense layer has none
  EXPECT_EQ(w.layers[0].mlp_gate.shape, (std::vector<int64_t>{192, 128}));
}

TEST_F(BindNorth, ZeroBiasesAreIgnoredAndANonZeroOneIsAnError) {
  add_bias("model.layers.1.self_attn.q_proj.weight", 0.0f);
  add_bias("model.layers.3.input_layernorm.weight", 0.0f);
  EXPECT_EQ(bind_error(config_, tensors_), "");
  add_bias("model.layers.2.mlp.experts.3.up_proj.weight", 0.5f);
  const std::string err = bind_error(config_, tensors_);
  EXPECT_NE(err.find("model.layers.2.mlp.experts.3.up_proj.bias"), std::string::npos) << err;
  EXPECT_NE(err.find("non-zero"), std::string::npos) << err;
}

TEST_F(BindNorth, ABiasOfNoWeightIsUnexpected) {
  add_bias("model.layers.1.self_attn.q_proj.weight", 0.0f);
  TensorView stray = tensors_.at("model.layers.1.self_attn.q_proj.bias");
  stray.name = "model.layers.1.self_attn.rotary.bias";
  tensors_[stray.name] = stray;
  const std::string err = bind_error(config_, tensors_);
  EXPECT_NE(err.find("unexpected tensor model.layers.1.self_attn.rotary.bias"), std::string::npos) << err;
}

TEST(ExpectedTensors, QwenBiasesAreUnexpected) {
  ModelConfig c = preset_config("tiny");
  std::unique_ptr<TensorStore> store = make_synthetic_tensors(c, 1);
  TensorMap tensors = store->tensors();
  TensorView b = tensors.at("model.norm.weight");
  b.name = "model.layers.0.self_attn.q_proj.bias";
  tensors[b.name] = b;
  EXPECT_NE(bind_error(c, tensors).find("unexpected tensor model.layers.0.self_attn.q_proj.bias"), std::string::npos);
}

}  // namespace
}  // namespace megadecode
