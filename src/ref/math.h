// Reference ops of the fp32 forward pass (the oracle for the device ops of the same name).
// Everything is fp32, computed from the weights' exact values (bf16/f16/f32 read and widened).
//
// Summation order (fixed, so results are bitwise deterministic and independent of threading):
// every dot product of length n, dot(a, b, n), uses kDotLanes = 8 partial sums: lane l
// accumulates a[i]*b[i] for i = l, l+8, l+16, ... (< n) in increasing i, each product rounded to
// fp32 and then added (no fused multiply-add); the lanes are then combined as
// ((s0+s1)+(s2+s3)) + ((s4+s5)+(s6+s7)). Matvecs, norms and attention scores all use dot().
// Sums over a short list in a given order (attention over positions, MoE over the k experts) are
// plain sequential fp32 sums in that order.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/tensor.h"
#include "ref/parallel.h"

namespace megadecode::ref {

constexpr int kDotLanes = 8;

// sum_i a[i]*b[i] in the order above.
float dot(const float* a, const float* b, int64_t n);

// Row `row` of a 2-D tensor [rows, cols] widened to fp32: out[cols].
void load_row(const TensorView& w, int64_t row, float* out);
// A 1-D tensor widened to fp32.
std::vector<float> load_vector(const TensorView& v);

// y[rows] = W x, W [rows, cols] (HF Linear layout [out, in]); y[r] = dot(W[r, :], x) with the row
// converted on the fly. Rows are split across the pool's threads (nullptr: the calling thread).
void matvec(const TensorView& w, const float* x, float* y, ThreadPool* pool);

// out[n] = (x * (1 / sqrt(mean(x^2) + eps))) * weight: mean of squares in fp32 via dot(x, x, n) / n,
// normalise first, then multiply by the weight (HF's order; HF casts to the activation dtype between
// the two, which is the identity here). `out` may alias `x`.
void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out);
// out[n] = ((x - mean) * (1 / sqrt(var + eps))) * weight, var the mean of (x - mean)^2 (Cohere's
// LayerNorm: no bias). `out` may alias `x`.
void layer_norm(const float* x, const float* weight, float eps, int64_t n, float* out);

// RoPE inverse frequencies, computed as HF does in fp32: inv_freq[i] = 1 / theta^(float(2i) / head_dim)
// for i < head_dim / 2 (the quotient and the power in fp32, theta rounded to fp32).
std::vector<float> rope_inv_freq(int head_dim, double theta);

// Rotates one head vector x[head_dim] in place for `pos`: angle_i = float(pos) * inv_freq[i] in fp32,
// then cos/sin. kNeox pairs (i, i + d/2) (HF rotate_half); kInterleaved pairs (2i, 2i+1) (GPT-J).
// Each output is (a*cos) + (±b*sin), two rounded products and one rounded sum.
void apply_rope(float* x, int head_dim, int pos, std::span<const float> inv_freq, RopeStyle style);

// silu(x) = x / (1 + exp(-x)).
float silu(float x);

// In-place softmax over x[n]: max-subtracted exp, sequential fp32 sum, then each divided by the sum.
void softmax(float* x, int64_t n);

// One query head attending over n keys: scores s_j = dot(q, k_j) * scale; p = softmax(s);
// out[head_dim] = sum_j p_j * v_j accumulated in j order. keys[j] and values[j] point at
// head_dim floats each.
void attention_head(const float* q, std::span<const float* const> keys, std::span<const float* const> values,
                    int head_dim, float scale, float* out);

// The k largest of scores[n], largest first; ties go to the lower index.
std::vector<int> top_k(const float* scores, int n, int k);

// MoE routing for one token: (expert, weight) pairs in top-k order (largest score first).
//   kSoftmaxTopK: p = softmax(logits) over all experts; top-k of p; weights p.
//   kSigmoidTopK: top-k of the logits; weights sigmoid(logit).
// With norm_topk_prob the k weights are divided by their sum (summed in top-k order).
std::vector<std::pair<int, float>> route(const float* router_logits, const ModelConfig& config);
// The scores route() ranks: softmax probabilities (kSoftmaxTopK) or the logits (kSigmoidTopK).
std::vector<float> route_scores(const float* router_logits, const ModelConfig& config);
// Each expert's probability before any renormalisation: the softmax, or sigmoid(logit). Ranks as
// route_scores does (ties aside); the routing audit measures its tie gaps on these.
std::vector<float> route_probabilities(const float* router_logits, const ModelConfig& config);
// route() with the experts given (a forced routing, in its order): their weights as route() would
// weigh them (renormalised over the given experts under norm_topk_prob).
std::vector<std::pair<int, float>> route_forced(const float* router_logits, const ModelConfig& config,
                                                std::span<const int32_t> experts);

}  // namespace megadecode::ref
