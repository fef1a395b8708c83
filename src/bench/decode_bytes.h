// What one decode step must read from HBM at minimum (the "floor" of bench decode): every weight
// the step touches once — attention projections and norms of every layer, the routers, the
// DISTINCT experts the step's routing chose in each layer (and the shared experts), the final
// norm and the LM head, the embedding rows of the batch — plus the keys each layer attends: the
// whole context on full-attention layers, the last `sliding_window` positions on sliding ones.
// Pure host arithmetic on the model shape (unit-tested); the GPU side supplies the routing it
// observed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/config.h"
#include "model/routing.h"

namespace megadecode {

struct StepBytes {
  int64_t attention = 0;  // q/k/v/o projections + input/post norms + q/k norms, all layers
  int64_t router = 0;     // routers, all layers
  int64_t experts = 0;    // distinct routed experts x (gate + up + down) + shared experts, per layer, summed
  int64_t lm_head = 0;    // LM head + final norm
  int64_t embed = 0;      // one embedding row per sequence
  int64_t kv = 0;         // sum over sequences of kv_bytes_read
  int64_t total() const { return attention + router + experts + lm_head + embed + kv; }
};

// K and V of one token over all layers: n_layers x 2 x n_kv_heads x head_dim x 2 bytes (bf16).
int64_t kv_bytes_per_token(const ModelConfig& c);
// K and V one decode step of a sequence of `context` keys (the new one included) reads over all
// layers: min(context, window) keys on a sliding layer, context on a full one.
int64_t kv_bytes_read(const ModelConfig& c, int context);
// One expert's gate + up + down matrices (bf16).
int64_t expert_bytes(const ModelConfig& c);
// Every weight of the model (bf16), untied LM head included: what the GPU must hold.
int64_t model_weight_bytes(const ModelConfig& c);

// context_lens: each sequence's context including the new token; distinct_experts: per layer
// (n_layers entries; dense layers ignore theirs).
StepBytes decode_step_bytes(const ModelConfig& c, std::span<const int> context_lens,
                            std::span<const int> distinct_experts);

// Distinct experts per layer of a step's routing (the CUDA backends' routing capture). A dense
// layer (not c.is_moe_layer) has none: its captured entries must all be expert -1 (how the backends
// record it), and its count is 0.
std::vector<int> distinct_experts(const RoutingLog& routing, const ModelConfig& c);

}  // namespace megadecode
