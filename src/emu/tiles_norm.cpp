// Norm tiles with their residual prologues:
//   ATTN_NORM:  x = embed[token] (layer 0) or h + Σ_k w_k·down_k (the previous layer's MoE combine,
//               top-k order, no atomics); xn = rms_norm(x) · input_layernorm
//   MOE_NORM:   h = x + Σ_g o_part[g] (O-proj partial sums, groups in order); hn = rms_norm(h) · post_norm
//   FINAL_NORM: x = h + combine of the last layer; xf = rms_norm(x) · final norm
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "emu/tiles.h"
#include "ref/math.h"

namespace megadecode::emu {

WidenedNorms widen_norms(const ModelConfig& config, const ModelWeights& weights) {
  WidenedNorms n;
  for (const LayerWeights& w : weights.layers) {
    n.input.push_back(ref::load_vector(w.input_norm));
    n.post_attn.push_back(ref::load_vector(w.post_attn_norm));
    n.q.push_back(config.qk_norm ? ref::load_vector(w.q_norm) : std::vector<float>{});
    n.k.push_back(config.qk_norm ? ref::load_vector(w.k_norm) : std::vector<float>{});
  }
  n.final_norm = ref::load_vector(weights.final_norm);
  n.inv_freq = ref::rope_inv_freq(config.head_dim, config.rope_theta);
  n.attn_scale = static_cast<float>(std::pow(static_cast<double>(config.head_dim), -0.5));
  return n;
}

namespace {

// out[hidden] = h[t] + Σ_k topk_w[t,k] · down_out[token_slot[t,k]] (the reference's accumulation:
// the MoE sum from zero in top-k order, then added to the residual).
void combine(const StepView& v, int t, float* out) {
  const PlanShape& s = v.shape();
  const int H = s.hidden, K = s.top_k;
  std::vector<float> moe(H, 0.0f);
  for (int k = 0; k < K; ++k) {
    const int32_t slot = v.token_slot[t * K + k];
    MD_REQUIRE(slot >= 0 && slot < s.batch * K, "combine: token ", t, " has no slot for k=", k,
               " (routing tables not written: missing dependency?)");
    const float w = v.topk_w[t * K + k];
    const float* d = v.down_out + static_cast<size_t>(slot) * H;
    for (int i = 0; i < H; ++i) moe[i] += w * d[i];
  }
  const float* h = v.h + static_cast<size_t>(t) * H;
  for (int i = 0; i < H; ++i) out[i] = h[i] + moe[i];
}

}  // namespace

void tile_attn_norm(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  const int H = s.hidden, L = task.layer;
  for (int t = task.arg[0]; t < task.arg[1]; ++t) {
    float* x = v.x + static_cast<size_t>(t) * H;
    if (L == 0) {
      const int32_t token = v.token_ids[t];
      MD_REQUIRE(token >= 0 && token < s.vocab, "token id ", token, " of sequence ", t, " outside the vocabulary");
      ref::load_row(v.weights->embed, token, x);
    } else {
      combine(v, t, x);
    }
    ref::rms_norm(x, v.norms->input[L].data(), v.config->rms_norm_eps, H, v.xn + static_cast<size_t>(t) * H);
  }
}

void tile_moe_norm(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  const int H = s.hidden, G = s.n_kv_heads;
  std::vector<float> acc(H);
  for (int t = task.arg[0]; t < task.arg[1]; ++t) {
    const float* o0 = v.o_part + static_cast<size_t>(t) * H;
    std::copy(o0, o0 + H, acc.begin());
    for (int g = 1; g < G; ++g) {
      const float* og = v.o_part + (static_cast<size_t>(g) * s.batch + t) * H;
      for (int i = 0; i < H; ++i) acc[i] += og[i];
    }
    const float* x = v.x + static_cast<size_t>(t) * H;
    float* h = v.h + static_cast<size_t>(t) * H;
    for (int i = 0; i < H; ++i) h[i] = x[i] + acc[i];
    ref::rms_norm(h, v.norms->post_attn[task.layer].data(), v.config->rms_norm_eps, H, v.hn + static_cast<size_t>(t) * H);
  }
}

void tile_final_norm(const StepView& v, Sync&, const Task& task) {
  const int H = v.shape().hidden;
  std::vector<float> x(H);
  for (int t = task.arg[0]; t < task.arg[1]; ++t) {
    combine(v, t, x.data());
    ref::rms_norm(x.data(), v.norms->final_norm.data(), v.config->rms_norm_eps, H, v.xf + static_cast<size_t>(t) * H);
  }
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
