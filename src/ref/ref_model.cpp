#include "ref/ref_model.h"

#include <algorithm>
#include <cmath>

#include "core/bf16.h"
#include "core/check.h"
#include "ref/math.h"

namespace megadecode::ref {

RefModel::RefModel(const ModelConfig& config, const ModelWeights& weights, ThreadPool* pool)
    : config_(config), weights_(weights), pool_(pool) {
  MD_REQUIRE(static_cast<int>(config.layers.size()) == config.n_layers, "config has ", config.layers.size(),
             " layer specs for ", config.n_layers, " layers");
  MD_REQUIRE(static_cast<int>(weights.layers.size()) == config.n_layers, "weights have ", weights.layers.size(),
             " layers, config ", config.n_layers);
  MD_REQUIRE(config.n_kv_heads > 0 && config.n_heads % config.n_kv_heads == 0, "n_heads ", config.n_heads,
             " is not a multiple of n_kv_heads ", config.n_kv_heads);
  const int d = config.head_dim;
  norms_.resize(config.n_layers);
  for (int l = 0; l < config.n_layers; ++l) {
    const LayerWeights& w = weights.layers[l];
    norms_[l].input = load_vector(w.input_norm);
    if (config.block == BlockKind::kSequential) norms_[l].post_attn = load_vector(w.post_attn_norm);
    if (config.qk_norm) {
      norms_[l].q = load_vector(w.q_norm);
      norms_[l].k = load_vector(w.k_norm);
    }
  }
  final_norm_ = load_vector(weights.final_norm);
  inv_freq_ = rope_inv_freq(d, config.rope_theta);
  attn_scale_ = static_cast<float>(std::pow(static_cast<double>(d), -0.5));  // HF: head_dim**-0.5

  const int h = config.hidden_size;
  x_.resize(h);
  xn_.resize(h);
  q_.resize(config.q_size());
  k_.resize(config.kv_size());
  v_.resize(config.kv_size());
  attn_.resize(config.q_size());
  attn_out_.resize(h);
  ffn_out_.resize(h);
  expert_out_.resize(h);
  const int inter =
      std::max({config.intermediate_size, config.moe_intermediate_size, config.shared_intermediate_size});
  gate_.resize(inter);
  up_.resize(inter);
  router_logits_.resize(std::max(config.n_experts, 0));
}

void RefModel::forward(const SeqChunk& chunk, KvStore& kv, std::span<float> logits) {
  const size_t n = chunk.tokens.size();
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  MD_REQUIRE(n > 0, "sequence ", chunk.seq_id, ": empty chunk");
  MD_REQUIRE(chunk.start_pos >= 0, "sequence ", chunk.seq_id, ": negative start position ", chunk.start_pos);
  const bool all = logits.size() == n * vocab;
  MD_REQUIRE(logits.empty() || logits.size() == vocab || all, "sequence ", chunk.seq_id, ": logits buffer of ",
             logits.size(), " floats is neither empty, [vocab] nor [n_tokens, vocab]");
  for (size_t i = 0; i < n; ++i) {
    MD_REQUIRE(chunk.tokens[i] >= 0 && chunk.tokens[i] < config_.vocab_size, "sequence ", chunk.seq_id, ": token id ",
               chunk.tokens[i], " outside the vocabulary [0, ", config_.vocab_size, ")");
  }
  // Validate every position's blocks (both pools) before writing anything.
  kv.check_tables(chunk);
  for (size_t i = 0; i < n; ++i) {
    float* out = nullptr;
    if (all) {
      out = logits.data() + i * vocab;
    } else if (!logits.empty() && i + 1 == n) {
      out = logits.data();
    }
    forward_token(chunk, chunk.tokens[i], chunk.start_pos + static_cast<int>(i), kv, out);
  }
}

float RefModel::round(float x) const { return device_rounding_ ? round_bf16(x) : x; }

void RefModel::norm(const float* x, const std::vector<float>& weight, float* out) const {
  const int h = config_.hidden_size;
  if (config_.norm == NormKind::kLayer) {
    layer_norm(x, weight.data(), config_.rms_norm_eps, h, out);
    if (device_rounding_)
      for (int i = 0; i < h; ++i) out[i] = round_bf16(out[i]);
    return;
  }
  if (!device_rounding_) {
    rms_norm(x, weight.data(), config_.rms_norm_eps, h, out);
    return;
  }
  // The device's rounding points: bf16(bf16(x * r) * w).
  const float inv_rms = 1.0f / std::sqrt(dot(x, x, h) / static_cast<float>(h) + config_.rms_norm_eps);
  for (int i = 0; i < h; ++i) out[i] = round_bf16(round_bf16(x[i] * inv_rms) * weight[i]);
}

void RefModel::forward_token(const SeqChunk& chunk, int32_t token, int pos, KvStore& kv, float* logits) {
  const int64_t seq = chunk.seq_id;
  const int h = config_.hidden_size;
  const TokenRouting* forced = forced_ ? forced_->find(seq, pos) : nullptr;
  if (forced)
    MD_REQUIRE(forced_->n_layers() == config_.n_layers && forced_->top_k() == config_.n_experts_per_tok,
               "forced routing of ", forced_->n_layers(), " layers x ", forced_->top_k(), " experts for a model of ",
               config_.n_layers, " x ", config_.n_experts_per_tok);
  if (record_) {
    MD_REQUIRE(record_->n_layers() == config_.n_layers && record_->top_k() == config_.n_experts_per_tok,
               "routing record of ", record_->n_layers(), " layers x ", record_->top_k(), " experts for a model of ",
               config_.n_layers, " x ", config_.n_experts_per_tok);
    token_experts_.assign(static_cast<size_t>(config_.n_layers) * config_.n_experts_per_tok, -1);
    token_weights_.assign(token_experts_.size(), 0.0f);
  }
  load_row(weights_.embed, token, x_.data());
  for (int l = 0; l < config_.n_layers; ++l) {
    norm(x_.data(), norms_[l].input, xn_.data());
    attention(l, pos, chunk, kv);
    if (config_.block == BlockKind::kSequential) {
      // h = x + Attn(N_in x); out = h + FFN(N_post h)
      for (int i = 0; i < h; ++i) x_[i] += attn_out_[i];
      norm(x_.data(), norms_[l].post_attn, xn_.data());
      ffn(l, forced, seq, pos);
      for (int i = 0; i < h; ++i) x_[i] += ffn_out_[i];
    } else {
      // out = (x + Attn(N_in x)) + FFN(N_in x): both branches read the same normed input.
      ffn(l, forced, seq, pos);
      for (int i = 0; i < h; ++i) x_[i] = (x_[i] + attn_out_[i]) + ffn_out_[i];
    }
  }
  if (record_) record_->record(seq, pos, token_experts_, token_weights_);
  if (logits == nullptr) return;
  norm(x_.data(), final_norm_, xn_.data());
  matvec(weights_.lm_head, xn_.data(), logits, pool_);
  if (config_.logit_scale != 1.0f)
    for (int i = 0; i < config_.vocab_size; ++i) logits[i] *= config_.logit_scale;
}

void RefModel::attention(int layer, int pos, const SeqChunk& chunk, KvStore& kv) {
  const LayerWeights& w = weights_.layers[layer];
  const LayerSpec& spec = config_.layers[layer];
  const int d = config_.head_dim, n_heads = config_.n_heads, n_kv = config_.n_kv_heads;
  const float eps = config_.rms_norm_eps;
  matvec(w.q_proj, xn_.data(), q_.data(), pool_);
  matvec(w.k_proj, xn_.data(), k_.data(), pool_);
  matvec(w.v_proj, xn_.data(), v_.data(), pool_);
  // Per-head q/k RMSNorm, then RoPE (HF order); V untouched.
  for (int hd = 0; hd < n_heads; ++hd) {
    float* q = q_.data() + hd * d;
    if (config_.qk_norm) rms_norm(q, norms_[layer].q.data(), eps, d, q);
    if (spec.use_rope) apply_rope(q, d, pos, inv_freq_, config_.rope_style);
  }
  for (int g = 0; g < n_kv; ++g) {
    float* k = k_.data() + g * d;
    if (config_.qk_norm) rms_norm(k, norms_[layer].k.data(), eps, d, k);
    if (spec.use_rope) apply_rope(k, d, pos, inv_freq_, config_.rope_style);
  }
  if (device_rounding_) {  // the cache holds bf16
    for (float& x : k_) x = round_bf16(x);
    for (float& x : v_) x = round_bf16(x);
  }
  // A sliding layer's K/V goes to the sequence's ring (with a ring pool), a full layer's to its blocks.
  const KvStore::Slot here = kv.locate(layer, chunk, pos);
  std::copy(k_.begin(), k_.end(), kv.key(layer, here));
  std::copy(v_.begin(), v_.end(), kv.value(layer, here));

  // Causal, optionally sliding: keys [first, pos], the current one included. A ring holds exactly
  // these for a sliding layer (and positions before `first` were overwritten).
  const int first = spec.sliding_window > 0 ? std::max(0, pos - spec.sliding_window + 1) : 0;
  const int n_keys = pos - first + 1;
  keys_.resize(n_keys);
  values_.resize(n_keys);
  const int group = n_heads / n_kv;
  for (int g = 0; g < n_kv; ++g) {
    for (int j = 0; j < n_keys; ++j) {
      const KvStore::Slot s = kv.locate(layer, chunk, first + j);
      keys_[j] = kv.key(layer, s) + g * d;
      values_[j] = kv.value(layer, s) + g * d;
    }
    for (int hd = g * group; hd < (g + 1) * group; ++hd) {  // GQA: query head hd reads kv head hd / group
      attention_head(q_.data() + hd * d, keys_, values_, d, attn_scale_, attn_.data() + hd * d);
    }
  }
  if (device_rounding_)
    for (float& x : attn_) x = round_bf16(x);
  matvec(w.o_proj, attn_.data(), attn_out_.data(), pool_);
}

void RefModel::ffn(int layer, const TokenRouting* forced, int64_t seq, int pos) {
  const LayerWeights& w = weights_.layers[layer];
  if (config_.layers[layer].ffn == FfnKind::kDense) {
    swiglu(w.mlp_gate, w.mlp_up, w.mlp_down, ffn_out_.data());
    return;
  }
  matvec(w.router, xn_.data(), router_logits_.data(), pool_);
  std::fill(ffn_out_.begin(), ffn_out_.end(), 0.0f);
  std::vector<std::pair<int, float>> chosen;
  if (forced) {
    const int k = config_.n_experts_per_tok;
    const std::span<const int32_t> experts(forced->experts.data() + static_cast<size_t>(layer) * k, k);
    chosen = route_forced(router_logits_.data(), config_, experts);
    std::vector<float> scores = route_probabilities(router_logits_.data(), config_);
    bool differs = false;
    const double gap = forced_route_gap(scores, experts, &differs);
    if (audit_) {
      ++audit_->n_forced;
      if (differs) audit_->diffs.push_back(RouteDiff{seq, pos, layer, gap});
    }
  } else {
    chosen = route(router_logits_.data(), config_);
  }
  if (record_)
    for (size_t j = 0; j < chosen.size(); ++j) {
      token_experts_[layer * chosen.size() + j] = chosen[j].first;
      token_weights_[layer * chosen.size() + j] = chosen[j].second;
    }
  // Sum over the selected experts in top-k order (largest weight first).
  for (const auto& [expert, weight] : chosen) {
    const ExpertWeights& e = w.experts[expert];
    swiglu(e.gate, e.up, e.down, expert_out_.data());
    for (int i = 0; i < config_.hidden_size; ++i) ffn_out_[i] += weight * expert_out_[i];
  }
  if (config_.shared_intermediate_size > 0) {  // routed + shared, or their mean
    swiglu(w.shared.gate, w.shared.up, w.shared.down, expert_out_.data());
    const bool average = config_.shared_combine == SharedCombine::kAverage;
    for (int i = 0; i < config_.hidden_size; ++i) {
      const float sum = ffn_out_[i] + expert_out_[i];
      ffn_out_[i] = average ? sum * 0.5f : sum;
    }
  }
}

void RefModel::swiglu(const TensorView& gate, const TensorView& up, const TensorView& down, float* out) {
  const int64_t inter = gate.shape[0];
  matvec(gate, xn_.data(), gate_.data(), pool_);
  matvec(up, xn_.data(), up_.data(), pool_);
  for (int64_t i = 0; i < inter; ++i) gate_[i] = round(silu(gate_[i]) * up_[i]);
  matvec(down, gate_.data(), out, pool_);
}

}  // namespace megadecode::ref
