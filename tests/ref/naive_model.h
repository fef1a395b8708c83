// An independent textbook model for tests: double precision, whole sequences, contiguous buffers
// (no paging, no per-token path), written straight from the HF semantics. Logits [n_tokens, vocab].
// min_route_gap receives the smallest gap between the k-th and (k+1)-th routing score seen: a
// near-tie there may select other experts in fp32, so tests re-draw such inputs.
#pragma once

#include <algorithm>
#include <numeric>

#include "naive_attention.h"
#include "ref_test_util.h"

namespace megadecode::test {
namespace naive {

using Mat = std::vector<std::vector<double>>;  // [rows][cols]

inline std::vector<double> linear(const TensorView& w, const std::vector<double>& x) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  std::vector<double> y(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols; ++i) y[r] += static_cast<double>(w.at(r * cols + i)) * x[i];
  }
  return y;
}

// Cohere's LayerNorm: mean-centred, weight only.
inline void layer(std::vector<double>& x, size_t off, size_t n, const TensorView& w, double eps) {
  double mean = 0, var = 0;
  for (size_t i = 0; i < n; ++i) mean += x[off + i];
  mean /= n;
  for (size_t i = 0; i < n; ++i) var += (x[off + i] - mean) * (x[off + i] - mean);
  const double r = 1.0 / std::sqrt(var / n + eps);
  for (size_t i = 0; i < n; ++i) x[off + i] = (x[off + i] - mean) * r * w.at(i);
}

inline void rms(std::vector<double>& x, size_t off, size_t n, const TensorView& w, double eps) {
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double r = 1.0 / std::sqrt(ss / n + eps);
  for (size_t i = 0; i < n; ++i) x[off + i] = x[off + i] * r * w.at(i);
}

inline void rope(std::vector<double>& x, size_t off, int d, int pos, double theta, RopeStyle style) {
  for (int i = 0; i < d / 2; ++i) {
    const double angle = pos * std::pow(theta, -2.0 * i / d);
    const int a = style == RopeStyle::kNeox ? i : 2 * i;
    const int b = style == RopeStyle::kNeox ? i + d / 2 : 2 * i + 1;
    const double xa = x[off + a], xb = x[off + b];
    x[off + a] = xa * std::cos(angle) - xb * std::sin(angle);
    x[off + b] = xb * std::cos(angle) + xa * std::sin(angle);
  }
}

inline std::vector<double> swiglu(const TensorView& g, const TensorView& u, const TensorView& d,
                                  const std::vector<double>& x) {
  std::vector<double> a = linear(g, x), b = linear(u, x);
  for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
  return linear(d, a);
}

inline std::vector<double> moe(const ModelConfig& c, const LayerWeights& L, const std::vector<double>& x,
                               double* min_gap) {
  std::vector<double> s = linear(L.router, x);
  if (c.router == RouterKind::kSoftmaxTopK) {
    const double m = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& v : s) sum += (v = std::exp(v - m));
    for (double& v : s) v /= sum;
  }
  std::vector<int> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return s[a] > s[b]; });
  const int k = c.n_experts_per_tok;
  if (k < static_cast<int>(s.size())) *min_gap = std::min(*min_gap, s[idx[k - 1]] - s[idx[k]]);
  std::vector<double> wts(k);
  double total = 0;
  for (int j = 0; j < k; ++j) {
    const double v = s[idx[j]];
    wts[j] = c.router == RouterKind::kSoftmaxTopK ? v : 1.0 / (1.0 + std::exp(-v));
    total += wts[j];
  }
  std::vector<double> out(x.size(), 0.0);
  for (int j = 0; j < k; ++j) {
    const ExpertWeights& e = L.experts[idx[j]];
    const std::vector<double> y = swiglu(e.gate, e.up, e.down, x);
    const double wj = c.norm_topk_prob ? wts[j] / total : wts[j];
    for (size_t i = 0; i < x.size(); ++i) out[i] += wj * y[i];
  }
  if (c.shared_intermediate_size > 0) {
    const std::vector<double> y = swiglu(L.shared.gate, L.shared.up, L.shared.down, x);
    const double f = c.shared_combine == SharedCombine::kAverage ? 0.5 : 1.0;
    for (size_t i = 0; i < x.size(); ++i) out[i] = (out[i] + y[i]) * f;
  }
  return out;
}

}  // namespace naive

inline std::vector<double> naive_logits(const ModelConfig& c, const ModelWeights& w,
                                        const std::vector<int32_t>& tokens, double* min_route_gap) {
  using naive::Mat;
  const int n = static_cast<int>(tokens.size()), h = c.hidden_size, d = c.head_dim;
  const double eps = c.rms_norm_eps;
  // The model's norm over a whole vector (q/k norms are RMSNorms in every family that has them).
  auto norm = [&](std::vector<double>& v, const TensorView& weight) {
    if (c.norm == NormKind::kLayer) naive::layer(v, 0, h, weight, eps);
    else naive::rms(v, 0, h, weight, eps);
  };
  *min_route_gap = INFINITY;
  Mat x(n, std::vector<double>(h));
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < h; ++i) x[t][i] = w.embed.at(static_cast<int64_t>(tokens[t]) * h + i);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    const LayerSpec& spec = c.layers[l];
    Mat xn = x, q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      norm(xn[t], L.input_norm);
      q[t] = naive::linear(L.q_proj, xn[t]);
      k[t] = naive::linear(L.k_proj, xn[t]);
      v[t] = naive::linear(L.v_proj, xn[t]);
      for (int hd = 0; hd < c.n_heads; ++hd) {
        if (c.qk_norm) naive::rms(q[t], hd * d, d, L.q_norm, eps);
        if (spec.use_rope) naive::rope(q[t], hd * d, d, t, c.rope_theta, c.rope_style);
      }
      for (int g = 0; g < c.n_kv_heads; ++g) {
        if (c.qk_norm) naive::rms(k[t], g * d, d, L.k_norm, eps);
        if (spec.use_rope) naive::rope(k[t], g * d, d, t, c.rope_theta, c.rope_style);
      }
    }
    for (int t = 0; t < n; ++t) {
      std::vector<double> att(c.q_size(), 0.0);
      for (int hd = 0; hd < c.n_heads; ++hd) {
        const int g = hd / (c.n_heads / c.n_kv_heads);
        const int first = spec.sliding_window > 0 ? std::max(0, t - spec.sliding_window + 1) : 0;
        const std::vector<double> head = naive::attention(
            t - first + 1, d, 1.0 / std::sqrt(static_cast<double>(d)), [&](int i) { return q[t][hd * d + i]; },
            [&](int j, int i) { return k[first + j][g * d + i]; },
            [&](int j, int i) { return v[first + j][g * d + i]; });
        std::copy(head.begin(), head.end(), att.begin() + hd * d);
      }
      const std::vector<double> o = naive::linear(L.o_proj, att);
      std::vector<double> ffn_in = xn[t];
      if (c.block == BlockKind::kSequential) {
        for (int i = 0; i < h; ++i) x[t][i] += o[i];
        ffn_in = x[t];
        norm(ffn_in, L.post_attn_norm);
      }
      const std::vector<double> f = spec.ffn == FfnKind::kDense
                                        ? naive::swiglu(L.mlp_gate, L.mlp_up, L.mlp_down, ffn_in)
                                        : naive::moe(c, L, ffn_in, min_route_gap);
      for (int i = 0; i < h; ++i) x[t][i] += (c.block == BlockKind::kSequential ? 0.0 : o[i]) + f[i];
    }
  }
  std::vector<double> logits(static_cast<size_t>(n) * c.vocab_size);
  for (int t = 0; t < n; ++t) {
    norm(x[t], w.final_norm);
    const std::vector<double> y = naive::linear(w.lm_head, x[t]);
    for (int i = 0; i < c.vocab_size; ++i) logits[static_cast<size_t>(t) * c.vocab_size + i] = y[i] * c.logit_scale;
  }
  return logits;
}

}  // namespace megadecode::test
