// ModelWeights: the named tensors of a checkpoint bound to the model's structure and checked
// against the config: every expected tensor present with the shape the config implies, nothing
// unexpected, a supported dtype. HF Linear weights are [out, in].
#pragma once

#include <vector>

#include "model/config.h"
#include "model/tensor.h"

namespace megadecode {

struct ExpertWeights {
  TensorView gate;  // [moe_intermediate, hidden]
  TensorView up;    // [moe_intermediate, hidden]
  TensorView down;  // [hidden, moe_intermediate]
};

struct LayerWeights {
  TensorView input_norm;      // [hidden]
  TensorView post_attn_norm;  // [hidden]; sequential blocks only
  TensorView q_proj;          // [n_heads*head_dim, hidden]
  TensorView k_proj;          // [n_kv_heads*head_dim, hidden]
  TensorView v_proj;          // [n_kv_heads*head_dim, hidden]
  TensorView o_proj;          // [hidden, n_heads*head_dim]
  TensorView q_norm;          // [head_dim]
  TensorView k_norm;          // [head_dim]
  // MoE layers
  TensorView router;                   // [n_experts, hidden]
  std::vector<ExpertWeights> experts;  // n_experts
  ExpertWeights shared;                // [shared_intermediate, hidden] ...; when the config has shared experts
  // Dense layers
  TensorView mlp_gate;  // [intermediate, hidden]
  TensorView mlp_up;    // [intermediate, hidden]
  TensorView mlp_down;  // [hidden, intermediate]
};

struct ModelWeights {
  TensorView embed;       // [vocab, hidden]
  TensorView final_norm;  // [hidden]
  TensorView lm_head;     // [vocab, hidden]; the embedding when tie_word_embeddings
  std::vector<LayerWeights> layers;
};

// The name and shape of every tensor a checkpoint of this config holds, in file order.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<TensorSpec> expected_tensors(const ModelConfig& config);

// Binds and validates. Errors name the tensor (and its file): missing, unexpected, wrong shape,
// unsupported dtype. A cohere2_moe checkpoint may carry all-zero ".bias" tensors of its linear
// layers and norms (Cohere's converters write them; the model has no biases): they are ignored,
// and one with a non-zero element is an Error.
ModelWeights bind_weights(const ModelConfig& config, const TensorMap& tensors);

}  // namespace megadecode
