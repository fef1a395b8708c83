// Byte accounting of one decode step (decode_bytes.h).
#include "bench/decode_bytes.h"

#include <algorithm>

#include "core/check.h"

namespace megadecode {
namespace {

constexpr int64_t kBf16 = 2;

int64_t attention_layer_bytes(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size();
  const int64_t proj = (q + 2 * kv) * h + h * q;  // q, k, v rows of H; o rows of q_size
  // input (+ post, sequential blocks; a parallel block's one norm feeds both), q/k norms
  const int64_t norms = (c.block == BlockKind::kParallel ? 1 : 2) * h + (c.qk_norm ? 2 * c.head_dim : 0);
  return (proj + norms) * kBf16;
}

int64_t dense_ffn_bytes(const ModelConfig& c) { return int64_t{3} * c.intermediate_size * c.hidden_size * kBf16; }
int64_t shared_expert_bytes(const ModelConfig& c) {
  return int64_t{3} * c.shared_intermediate_size * c.hidden_size * kBf16;
}

}  // namespace

int64_t kv_bytes_per_token(const ModelConfig& c) {
  return static_cast<int64_t>(c.n_layers) * 2 * c.n_kv_heads * c.head_dim * kBf16;
}

int64_t expert_bytes(const ModelConfig& c) {
  return int64_t{3} * c.moe_intermediate_size * c.hidden_size * kBf16;
}

int64_t model_weight_bytes(const ModelConfig& c) {
  int64_t b = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    b += attention_layer_bytes(c);
    if (c.is_moe_layer(l))
      b += static_cast<int64_t>(c.n_experts) * (expert_bytes(c) + int64_t{c.hidden_size} * kBf16) +
           shared_expert_bytes(c);
    else
      b += dense_ffn_bytes(c);
  }
  const int64_t table = static_cast<int64_t>(c.vocab_size) * c.hidden_size * kBf16;
  return b + table * (c.tie_word_embeddings ? 1 : 2) + int64_t{c.hidden_size} * kBf16;
}

StepBytes decode_step_bytes(const ModelConfig& c, std::span<const int> context_lens,
                            std::span<const int> distinct_experts) {
  MD_REQUIRE(distinct_experts.size() == static_cast<size_t>(c.n_layers), "decode_step_bytes: ",
             distinct_experts.size(), " distinct-expert counts for ", c.n_layers, " layers");
  StepBytes s;
  for (int l = 0; l < c.n_layers; ++l) {
    s.attention += attention_layer_bytes(c);
    if (c.is_moe_layer(l)) {
      const int d = distinct_experts[l];
      MD_REQUIRE(d >= 0 && d <= c.n_experts, "decode_step_bytes: layer ", l, " has ", d, " distinct experts of ",
                 c.n_experts);
      s.router += static_cast<int64_t>(c.n_experts) * c.hidden_size * kBf16;
      s.experts += d * expert_bytes(c) + shared_expert_bytes(c);
    } else {
      s.experts += dense_ffn_bytes(c);
    }
  }
  s.lm_head = (static_cast<int64_t>(c.vocab_size) + 1) * c.hidden_size * kBf16;
  s.embed = static_cast<int64_t>(context_lens.size()) * c.hidden_size * kBf16;
  for (int n : context_lens) {
    MD_REQUIRE(n >= 1, "decode_step_bytes: context length ", n);
    s.kv += kv_bytes_read(c, n);
  }
  return s;
}

int64_t kv_bytes_read(const ModelConfig& c, int context) {
  const int64_t per_layer = int64_t{2} * c.n_kv_heads * c.head_dim * kBf16;
  int64_t keys = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const int window = c.layers.at(l).sliding_window;
    keys += window > 0 ? std::min(context, window) : context;
  }
  return keys * per_layer;
}

std::vector<int> distinct_experts(const RoutingLog& routing, const ModelConfig& c) {
  const int n_layers = c.n_layers, n_experts = c.n_experts;
  MD_REQUIRE(routing.n_layers() == n_layers && routing.size() > 0, "distinct_experts: a routing of ",
             routing.n_layers(), " layers and ", routing.size(), " tokens for ", n_layers, " layers");
  std::vector<int> out(n_layers);
  const int K = routing.top_k();
  for (int l = 0; l < n_layers; ++l) {
    const bool moe = c.is_moe_layer(l);
    std::vector<char> seen(n_experts, 0);
    for (const auto& [key, t] : routing.tokens())
      for (int k = 0; k < K; ++k) {
        const int32_t e = t.experts[l * K + k];
        if (!moe) {
          MD_REQUIRE(e == -1, "distinct_experts: dense layer ", l, " records expert ", e, " (expected -1)");
          continue;
        }
        MD_REQUIRE(e >= 0 && e < n_experts, "distinct_experts: layer ", l, " routes to expert ", e, " of ", n_experts);
        seen[e] = 1;
      }
    out[l] = static_cast<int>(std::count(seen.begin(), seen.end(), 1));
  }
  return out;
}

}  // namespace megadecode
