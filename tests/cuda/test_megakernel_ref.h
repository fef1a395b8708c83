// Host reference of one decode step for the megakernel tests: the qwen3_moe forward pass in fp32
// with the device's bf16 rounding points (norm outputs, attention output, SiLU*up and the KV cache
// are bf16; everything else fp32), so routing decisions match and the comparison measures the
// kernel, not bf16 noise. Reads the same weight bytes (host synthetic model) and the same KV
// history (a host copy of the device cache).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "model/config.h"
#include "model/weights.h"

namespace megadecode::test {

inline float rb(float x) { return round_bf16(x); }

inline const uint16_t* bf16_data(const TensorView& v) { return reinterpret_cast<const uint16_t*>(v.data); }

// y[r] = sum_k W[r][k] x[k], W bf16 [rows, cols].
inline void matvec(const TensorView& w, const float* x, float* y) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  const uint16_t* d = bf16_data(w);
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* row = d + r * cols;
    double acc = 0.0;
    for (int64_t k = 0; k < cols; ++k) acc += static_cast<double>(bf16_bits_to_float(row[k])) * x[k];
    y[r] = static_cast<float>(acc);
  }
}

inline void rms_bf16(const float* x, const TensorView& w, float eps, int n, float* out) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int i = 0; i < n; ++i) out[i] = rb(rb(x[i] * r) * bf16_bits_to_float(bf16_data(w)[i]));
}

struct RefSeq {
  int32_t token;
  int n_ctx;                   // context including the new token (at n_ctx - 1)
  std::vector<int32_t> table;  // physical KV blocks
};

// KV history: [n_layers][2][n_blocks][G][bs][D] bf16 bits (the device layout).
struct RefKv {
  const uint16_t* data;
  int n_blocks, block_size;
  float at(const ModelConfig& c, int layer, int kv, int block, int g, int slot, int d) const {
    const int64_t i = ((((static_cast<int64_t>(layer) * 2 + kv) * n_blocks + block) * c.n_kv_heads + g) * block_size +
                       slot) * c.head_dim + d;
    return bf16_bits_to_float(data[i]);
  }
};

// Logits [vocab] of one sequence's decode step. route_margin (optional): the smallest gap, over
// the layers, between the router probabilities of the K-th and (K+1)-th expert: a near-tie there
// lets rounding noise swap an expert (a large logit change that is not a kernel bug).
inline std::vector<float> ref_decode(const ModelConfig& c, const ModelWeights& w, const RefKv& kv, const RefSeq& s,
                                     float* route_margin = nullptr) {
  const int H = c.hidden_size, D = c.head_dim, G = c.n_kv_heads, gs = c.group_size(), nq = c.n_heads * D;
  const int E = c.n_experts, K = c.n_experts_per_tok, I = c.moe_intermediate_size;
  const int pos = s.n_ctx - 1;
  std::vector<float> x(H), xn(H), q(nq), k(G * D), v(G * D), att(nq), o(H), h(H), hn(H), rl(E), g1(I), u1(I),
      act(I), dn(H), moe(H);
  const uint16_t* emb = bf16_data(w.embed) + static_cast<int64_t>(s.token) * H;
  for (int i = 0; i < H; ++i) x[i] = bf16_bits_to_float(emb[i]);
  std::vector<float> inv(D / 2);
  for (int i = 0; i < D / 2; ++i)
    inv[i] = 1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(2 * i) / static_cast<float>(D));
  auto head_norm_rope = [&](float* vec, const TensorView& nw) {
    double ss = 0.0;
    for (int d = 0; d < D; ++d) ss += static_cast<double>(vec[d]) * vec[d];
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / D) + c.rms_norm_eps);
    std::vector<float> t(D);
    for (int d = 0; d < D; ++d) t[d] = (vec[d] * r) * bf16_bits_to_float(bf16_data(nw)[d]);
    for (int d = 0; d < D; ++d) {
      const float ang = static_cast<float>(pos) * inv[d % (D / 2)];
      const float cs = std::cos(ang), sn = std::sin(ang);
      vec[d] = d < D / 2 ? t[d] * cs - t[d + D / 2] * sn : t[d] * cs + t[d - D / 2] * sn;
    }
  };
  for (int L = 0; L < c.n_layers; ++L) {
    const LayerWeights& lw = w.layers[L];
    rms_bf16(x.data(), lw.input_norm, c.rms_norm_eps, H, xn.data());
    matvec(lw.q_proj, xn.data(), q.data());
    matvec(lw.k_proj, xn.data(), k.data());
    matvec(lw.v_proj, xn.data(), v.data());
    for (int hq = 0; hq < c.n_heads; ++hq) head_norm_rope(q.data() + hq * D, lw.q_norm);
    for (int g = 0; g < G; ++g) {
      head_norm_rope(k.data() + g * D, lw.k_norm);
      for (int d = 0; d < D; ++d) {  // the cache holds bf16
        k[g * D + d] = rb(k[g * D + d]);
        v[g * D + d] = rb(v[g * D + d]);
      }
    }
    for (int hq = 0; hq < c.n_heads; ++hq) {
      const int g = hq / gs;
      std::vector<double> sc(s.n_ctx);
      double mx = -1e300;
      for (int j = 0; j < s.n_ctx; ++j) {
        double acc = 0.0;
        for (int d = 0; d < D; ++d) {
          const float kd = j == pos ? k[g * D + d]
                                    : kv.at(c, L, 0, s.table[j / kv.block_size], g, j % kv.block_size, d);
          acc += static_cast<double>(q[hq * D + d]) * kd;
        }
        sc[j] = acc / std::sqrt(static_cast<double>(D));
        mx = std::max(mx, sc[j]);
      }
      double den = 0.0;
      for (int j = 0; j < s.n_ctx; ++j) den += (sc[j] = std::exp(sc[j] - mx));
      for (int d = 0; d < D; ++d) {
        double acc = 0.0;
        for (int j = 0; j < s.n_ctx; ++j) {
          const float vd = j == pos ? v[g * D + d]
                                    : kv.at(c, L, 1, s.table[j / kv.block_size], g, j % kv.block_size, d);
          acc += sc[j] * vd;
        }
        att[hq * D + d] = rb(static_cast<float>(acc / den));
      }
    }
    matvec(lw.o_proj, att.data(), o.data());
    for (int i = 0; i < H; ++i) h[i] = x[i] + o[i];
    rms_bf16(h.data(), lw.post_attn_norm, c.rms_norm_eps, H, hn.data());
    matvec(lw.router, hn.data(), rl.data());
    const float mxl = *std::max_element(rl.begin(), rl.end());
    double sum = 0.0;
    std::vector<float> p(E);
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(rl[e] - mxl));
    for (int e = 0; e < E; ++e) p[e] = static_cast<float>(p[e] / sum);
    std::vector<int> idx(E);
    for (int e = 0; e < E; ++e) idx[e] = e;
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b]; });
    if (route_margin && K < E) *route_margin = std::min(L == 0 ? INFINITY : *route_margin, p[idx[K - 1]] - p[idx[K]]);
    double top = 0.0;
    for (int j = 0; j < K; ++j) top += p[idx[j]];
    std::fill(moe.begin(), moe.end(), 0.0f);
    for (int j = 0; j < K; ++j) {
      const ExpertWeights& ew = lw.experts[idx[j]];
      const float wgt = c.norm_topk_prob ? static_cast<float>(p[idx[j]] / top) : p[idx[j]];
      matvec(ew.gate, hn.data(), g1.data());
      matvec(ew.up, hn.data(), u1.data());
      for (int i = 0; i < I; ++i) act[i] = rb(g1[i] / (1.0f + std::exp(-g1[i])) * u1[i]);
      matvec(ew.down, act.data(), dn.data());
      for (int i = 0; i < H; ++i) moe[i] += wgt * dn[i];
    }
    for (int i = 0; i < H; ++i) x[i] = h[i] + moe[i];
  }
  rms_bf16(x.data(), w.final_norm, c.rms_norm_eps, H, xn.data());
  std::vector<float> logits(c.vocab_size);
  matvec(w.lm_head, xn.data(), logits.data());
  return logits;
}

// ref_decode for every sequence, spread over hardware threads.
inline std::vector<std::vector<float>> ref_decode_all(const ModelConfig& c, const ModelWeights& w, const RefKv& kv,
                                                      const std::vector<RefSeq>& seqs,
                                                      std::vector<float>* route_margins = nullptr) {
  std::vector<std::vector<float>> out(seqs.size());
  if (route_margins) route_margins->assign(seqs.size(), INFINITY);
  const unsigned n_threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(),
                                                             static_cast<unsigned>(seqs.size())));
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n_threads; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = t; i < seqs.size(); i += n_threads)
        out[i] = ref_decode(c, w, kv, seqs[i], route_margins ? &(*route_margins)[i] : nullptr);
    });
  for (auto& th : threads) th.join();
  return out;
}

}  // namespace megadecode::test
