// The fp32 reference forward pass (HF qwen3_moe and cohere2_moe semantics, DESIGN.md §3), one
// token at a time.
// Prefill and decode run the very same per-token code (a chunk is its tokens in order, each
// through every layer before the next starts), so prefill + incremental decode reproduces the
// logits of a full recomputation bitwise. Structure follows ModelConfig's generality: sequential
// or parallel blocks, per-layer sliding window / NoPE / dense-or-MoE FFN, softmax or sigmoid
// router, shared experts (summed or averaged with the routed ones), RMSNorm or LayerNorm, tied
// embeddings, NeoX or interleaved RoPE, scaled logits.
// Options for comparisons with the CUDA paths (tests):
//  - device rounding: round to bf16 where the device stores bf16 (the RMSNorm outputs, as
//    bf16(bf16(x * r) * w); the K/V cache; the attention output; SiLU(gate) * up), so that only
//    summation order separates the two;
//  - a forced routing: tokens found in the log use its experts (weighted by this model's own
//    router probabilities, renormalised as the config says); every forced decision is audited
//    against this model's own top-k (model/routing.h).
// Threading: one caller at a time; matvecs fan out over the given pool.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend.h"
#include "model/config.h"
#include "model/routing.h"
#include "model/weights.h"
#include "ref/kv_store.h"
#include "ref/parallel.h"

namespace megadecode::ref {

class RefModel {
 public:
  // The bytes `weights` views point at and `pool` must outlive the model; pool may be null.
  RefModel(const ModelConfig& config, const ModelWeights& weights, ThreadPool* pool);

  const ModelConfig& config() const { return config_; }

  // Runs the chunk's tokens at positions start_pos, start_pos+1, ..., writing their K/V into `kv`
  // through the chunk's block table (and its ring table for sliding layers, when `kv` has a ring
  // pool). `logits` is empty (none), [vocab] (the last token's) or
  // [n_tokens, vocab] (every position's). Error for bad token ids, positions or block tables.
  void forward(const SeqChunk& chunk, KvStore& kv, std::span<float> logits);

  void set_device_rounding(bool on) { device_rounding_ = on; }
  // `forced` and `audit` must outlive their use; nullptr turns forcing off.
  void set_forced_routing(const RoutingLog* forced, RoutingAudit* audit) {
    forced_ = forced;
    audit_ = audit;
  }
  // Records every token's routing (forced or own) into `log` (nullptr: off).
  void set_routing_record(RoutingLog* log) { record_ = log; }

 private:
  struct LayerNorms {
    std::vector<float> input, post_attn, q, k;  // [hidden], [hidden], [head_dim], [head_dim]
  };

  void forward_token(const SeqChunk& chunk, int32_t token, int pos, KvStore& kv, float* logits);
  void attention(int layer, int pos, const SeqChunk& chunk, KvStore& kv);  // xn_ -> attn_out_
  // xn_ -> ffn_out_; `forced`: this token's forced routing or nullptr.
  void ffn(int layer, const TokenRouting* forced, int64_t seq, int pos);
  void norm(const float* x, const std::vector<float>& weight, float* out) const;  // the config's norm, rounded
  float round(float x) const;  // bf16 under device rounding, else x
  // out[hidden] = down(silu(gate xn) * (up xn)).
  void swiglu(const TensorView& gate, const TensorView& up, const TensorView& down, float* out);

  const ModelConfig config_;
  const ModelWeights weights_;
  ThreadPool* pool_;
  std::vector<LayerNorms> norms_;  // small weights widened once
  std::vector<float> final_norm_;  // [hidden]
  std::vector<float> inv_freq_;    // [head_dim / 2]
  float attn_scale_;               // head_dim^-0.5
  bool device_rounding_ = false;
  const RoutingLog* forced_ = nullptr;
  RoutingAudit* audit_ = nullptr;
  RoutingLog* record_ = nullptr;
  std::vector<int32_t> token_experts_;  // [n_layers * top_k] of the token being run (record_)
  std::vector<float> token_weights_;

  // Per-token scratch.
  std::vector<float> x_;              // [hidden] residual stream
  std::vector<float> xn_;             // [hidden] normed input of the current sub-block
  std::vector<float> q_, k_, v_;      // [n_heads*head_dim], [n_kv_heads*head_dim] x2
  std::vector<float> attn_;           // [n_heads*head_dim] attention output before o_proj
  std::vector<float> attn_out_;       // [hidden]
  std::vector<float> ffn_out_;        // [hidden]
  std::vector<float> expert_out_;     // [hidden]
  std::vector<float> gate_, up_;      // [max(intermediate, moe_intermediate)]
  std::vector<float> router_logits_;  // [n_experts]
  std::vector<const float*> keys_, values_;  // [attended positions] pointers into the KV store
};

}  // namespace megadecode::ref
