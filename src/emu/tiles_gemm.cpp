// GEMM tiles: a task owns 16-row blocks of a weight matrix and computes them for every token of
// the batch (each weight row is read once per step, as on the GPU). The input is normalised in the
// tile's own prologue from the fp32 residual (QKV: x, or the embedding at layer 0, with
// input_layernorm; router: h with post_attention_layernorm; LM head: the final x with the final
// norm); O-proj reads the merged attention output and adds the residual, h = x + o. Rows are widened
// to fp32 and dotted with ref::dot, so every output is bitwise the reference's.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "emu/tiles.h"
#include "ref/math.h"

namespace megadecode::emu {

WidenedNorms widen_norms(const ModelConfig& config, const ModelWeights& weights) {
  WidenedNorms n;
  for (const LayerWeights& w : weights.layers) {
    n.input.push_back(ref::load_vector(w.input_norm));
    n.post_attn.push_back(config.block == BlockKind::kSequential ? ref::load_vector(w.post_attn_norm)
                                                                 : std::vector<float>{});
    n.q.push_back(config.qk_norm ? ref::load_vector(w.q_norm) : std::vector<float>{});
    n.k.push_back(config.qk_norm ? ref::load_vector(w.k_norm) : std::vector<float>{});
  }
  n.final_norm = ref::load_vector(weights.final_norm);
  n.inv_freq = ref::rope_inv_freq(config.head_dim, config.rope_theta);
  n.attn_scale = static_cast<float>(std::pow(static_cast<double>(config.head_dim), -0.5));
  return n;
}

std::vector<float> normed_row(const StepView& v, const float* residual, int t, const std::vector<float>& weight) {
  const int H = v.shape().hidden;
  std::vector<float> out(H);
  const float* x = residual + static_cast<size_t>(t) * H;
  if (v.config->norm == NormKind::kLayer)  // cohere2_moe without rms_norm_eps (weight only, as cpu-ref)
    ref::layer_norm(x, weight.data(), v.config->rms_norm_eps, H, out.data());
  else
    ref::rms_norm(x, weight.data(), v.config->rms_norm_eps, H, out.data());
  return out;
}

namespace {

// y[t][row] = dot(W[row], in[t]) for the task's rows, handed to `store(t, row, y)`.
template <class Row, class Store>
void gemm_rows(const StepView& v, const Task& task, int n_rows, int k, const std::vector<std::vector<float>>& in,
               Row load, Store store) {
  std::vector<float> w(k);
  for (int r = task.arg[0] * 16; r < std::min(n_rows, task.arg[1] * 16); ++r) {
    load(r, w.data());
    for (int t = 0; t < v.shape().batch; ++t) store(t, r, ref::dot(w.data(), in[t].data(), k));
  }
}

std::vector<std::vector<float>> normed_batch(const StepView& v, const float* residual, const std::vector<float>& weight) {
  std::vector<std::vector<float>> out;
  for (int t = 0; t < v.shape().batch; ++t) out.push_back(normed_row(v, residual, t, weight));
  return out;
}

// RMSNorm of the layer's input (the embedding at layer 0) with input_layernorm, every token.
std::vector<std::vector<float>> normed_input(const StepView& v, int layer) {
  const std::vector<float> emb = layer == 0 ? embedding(v) : std::vector<float>{};
  return normed_batch(v, layer == 0 ? emb.data() : v.x, v.norms->input[layer]);
}

}  // namespace

std::vector<float> embedding(const StepView& v) {
  const PlanShape& s = v.shape();
  std::vector<float> x(static_cast<size_t>(s.batch) * s.hidden);
  for (int t = 0; t < s.batch; ++t) {
    const int32_t token = v.token_ids[t];
    MD_REQUIRE(token >= 0 && token < s.vocab, "token id ", token, " of sequence ", t, " outside the vocabulary");
    ref::load_row(v.weights->embed, token, x.data() + static_cast<size_t>(t) * s.hidden);
  }
  return x;
}

std::vector<std::vector<float>> ffn_input(const StepView& v, int layer) {
  if (v.shape().parallel) return normed_input(v, layer);
  return normed_batch(v, v.h, v.norms->post_attn[layer]);
}

void tile_qkv(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  const int L = task.layer, D = s.head_dim, gs = s.group_size;
  const LayerWeights& w = v.weights->layers[L];
  const auto xn = normed_input(v, L);
  gemm_rows(
      v, task, s.n_kv_heads * s.qkv_group_rows, s.hidden, xn,
      [&](int r, float* row) {
        // Fused rows of group g: its gs q heads, then its k head, then its v head.
        const int g = r / s.qkv_group_rows, i = r % s.qkv_group_rows;
        if (i < gs * D) ref::load_row(w.q_proj, static_cast<int64_t>(g) * gs * D + i, row);
        else if (i < (gs + 1) * D) ref::load_row(w.k_proj, static_cast<int64_t>(g) * D + (i - gs * D), row);
        else ref::load_row(w.v_proj, static_cast<int64_t>(g) * D + (i - (gs + 1) * D), row);
      },
      [&](int t, int r, float y) { v.qkv[static_cast<size_t>(t) * s.n_kv_heads * s.qkv_group_rows + r] = y; });
}

// Sequential blocks: h = x + o. Parallel blocks: o alone into o_out (the down shares add
// (x + o) + F).
void tile_o_proj(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  const int H = s.hidden, q_size = s.n_heads * s.head_dim;
  const std::vector<float> emb = task.layer == 0 && !s.parallel ? embedding(v) : std::vector<float>{};
  const float* residual = task.layer == 0 ? emb.data() : v.x;
  float* out = s.parallel ? v.o_out : v.h;
  std::vector<std::vector<float>> a;
  for (int t = 0; t < s.batch; ++t) a.emplace_back(v.attn_out + static_cast<size_t>(t) * q_size, v.attn_out + (t + 1) * static_cast<size_t>(q_size));
  gemm_rows(
      v, task, H, q_size, a, [&](int r, float* row) { ref::load_row(v.weights->layers[task.layer].o_proj, r, row); },
      [&](int t, int r, float y) {
        const size_t at = static_cast<size_t>(t) * H + r;
        out[at] = s.parallel ? y : residual[at] + y;
      });
}

void tile_router(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  const auto hn = ffn_input(v, task.layer);
  gemm_rows(
      v, task, s.n_experts, s.hidden, hn, [&](int r, float* row) { ref::load_row(v.weights->layers[task.layer].router, r, row); },
      [&](int t, int r, float y) { v.router_logits[static_cast<size_t>(t) * s.n_experts + r] = y; });
}

void tile_lm_head(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  const auto xf = normed_batch(v, v.x, v.norms->final_norm);
  gemm_rows(
      v, task, s.vocab, s.hidden, xf, [&](int r, float* row) { ref::load_row(v.weights->lm_head, r, row); },
      [&](int t, int r, float y) { v.logits[static_cast<size_t>(t) * s.vocab + r] = s.logit_scale != 1.0f ? y * s.logit_scale : y; });
}

void tile_sample(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  MD_REQUIRE(v.sampler != nullptr && *v.sampler, "the plan samples but the step has no sampler");
  for (int t = task.arg[0]; t < task.arg[1]; ++t) {
    std::span<const float> logits(v.logits + static_cast<size_t>(t) * s.vocab, static_cast<size_t>(s.vocab));
    v.out_tokens[t] = (*v.sampler)(t, logits);
  }
}

}  // namespace megadecode::emu
