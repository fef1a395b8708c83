// Synthetic weights as a pure function: element i of a tensor is
//   offset + scale * u,  u = uniform_at(seed, tensor id, i) truncated to 16 bits,
// then rounded to bf16. Host (`make-model` files) and device (`--random-weights`) evaluate the same
// header, so both hold bit-identical weights. The tensor id is FNV-1a of the name, computed on the
// host; the per-tensor SyntheticInit {id, scale, offset} is plain data a kernel can take as is.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "core/bf16.h"
#include "core/rng.h"

namespace megadecode {

// What a tensor does decides its scale (see synthetic_init below).
enum class SyntheticKind : uint32_t {
  kEmbedding,   // model.embed_tokens
  kNorm,        // every RMSNorm weight (layer norms, q/k norms, final norm)
  kInProj,      // q/k/v, expert and dense gate/up: read a normalised input
  kOutProj,     // self_attn.o_proj: writes into the residual
  kExpertDown,  // mlp.experts.E.down_proj: writes into the residual through the top-k combine
  kDenseDown,   // mlp.down_proj of a dense layer: writes into the residual
  kRouter,      // mlp.gate
  kLmHead,      // lm_head
};

struct SyntheticInit {
  uint64_t id = 0;      // synthetic_tensor_id(name)
  float scale = 0.0f;   // a bf16 value (8 significant bits), so scale * u is exact in fp32
  float offset = 0.0f;  // 1 for norm weights, else 0
};
static_assert(sizeof(SyntheticInit) == 16, "SyntheticInit is shared with device code");

// The model dimensions a scale depends on.
struct SyntheticDims {
  int fan_in = 1;             // the input width of a linear layer ([out, in]: in)
  int n_layers = 1;
  int n_experts_per_tok = 1;
  // The top-k weights are not renormalised (a sigmoid router without norm_topk_prob): each is
  // sigmoid of a top logit, about 0.8, instead of about 1/k.
  bool unnormalised_weights = false;
};

// SyntheticDims::unnormalised_weights: the typical weight it stands for.
constexpr double kUnnormalisedRouteWeight = 0.8;

// E[silu(z)^2] for z ~ N(0, 1): the variance of silu(gate) * up when gate and up have unit variance.
constexpr double kSiluSquareMean = 0.3558;

// Scales keep activations well-conditioned through all layers (the residual stays O(1), no layer's
// contribution vanishes). The residual starts at unit variance and each of the 2L sublayers adds
// about 1/(2L) (GPT-2's residual scaling), so after L layers its variance is about 2.
//  - embedding: uniform * sqrt(3) has variance 1: a unit-variance residual.
//  - in-projections (q/k/v, gate/up) read an RMS-normalised input (unit rms): uniform * sqrt(3/fan_in)
//    gives unit-variance outputs, so attention scores q.k/sqrt(d) have O(1) spread (softmax neither
//    flat nor one-hot) and silu(gate) sits in its curved range.
//  - o_proj reads a convex combination of unit-variance v rows (variance <= 1, = 1 at one position):
//    sqrt(3/fan_in) / sqrt(2L) adds at most 1/(2L) to the residual's variance.
//  - expert down reads silu(gate)*up (variance kSiluSquareMean), and the combine of k independent
//    experts with weights near 1/k divides the variance by k: sqrt(3/fan_in) * sqrt(k / 0.356) /
//    sqrt(2L) restores 1/(2L). Dense down: the same without the k. With unnormalised weights w
//    (about 0.8 each) the combine multiplies the variance by k w^2 instead: 1 / sqrt(k w^2 0.356).
//  - router: sqrt(3/hidden) gives unit-variance logits: routing is spread over many experts (no
//    expert dominates) but the top-k are well separated from the rest, not a near-uniform tie.
//  - lm_head: sqrt(3/hidden), unit-variance logits over the vocabulary.
//  - norm weights: 1 + 0.2 * uniform, in [0.8, 1.2): close to 1 so they do not distort the scales
//    above, far enough from 1 that a norm weight read wrongly (or not at all) changes the logits.
// Measured with an fp32 forward of a 48-layer model of these scales (hidden 256, 32 experts top-8,
// 12 tokens): residual rms 1.00 after layer 0, 1.37 after layer 47; attention and MoE outputs rms
// 0.06 and 0.11 per layer; attention entropy ~1.4 nats; the largest renormalised top-k weight ~0.26
// (uniform would be 0.125); logits rms 1.0. With the tiny preset's 3 layers each sublayer adds
// rms 0.26-0.49 to a residual of ~1, so every layer visibly changes the logits.
// Computed in double (correctly rounded on host and device, fast-math or not), then rounded to bf16.
MD_HOST_DEVICE inline SyntheticInit synthetic_init(uint64_t id, SyntheticKind kind, SyntheticDims dims) {
  const double in_scale = sqrt(3.0 / static_cast<double>(dims.fan_in > 0 ? dims.fan_in : 1));
  const double residual = 1.0 / sqrt(2.0 * static_cast<double>(dims.n_layers > 0 ? dims.n_layers : 1));
  const double k = static_cast<double>(dims.n_experts_per_tok > 0 ? dims.n_experts_per_tok : 1);
  double scale = 0.0, offset = 0.0;
  switch (kind) {
    case SyntheticKind::kEmbedding: scale = sqrt(3.0); break;
    case SyntheticKind::kNorm: scale = 0.2; offset = 1.0; break;
    case SyntheticKind::kInProj: scale = in_scale; break;
    case SyntheticKind::kOutProj: scale = in_scale * residual; break;
    case SyntheticKind::kExpertDown:
      scale = dims.unnormalised_weights
                  ? in_scale * sqrt(1.0 / (k * kUnnormalisedRouteWeight * kUnnormalisedRouteWeight * kSiluSquareMean)) *
                        residual
                  : in_scale * sqrt(k / kSiluSquareMean) * residual;
      break;
    case SyntheticKind::kDenseDown: scale = in_scale * sqrt(1.0 / kSiluSquareMean) * residual; break;
    case SyntheticKind::kRouter: scale = in_scale; break;
    case SyntheticKind::kLmHead: scale = in_scale; break;
  }
  SyntheticInit init;
  init.id = id;
  init.scale = round_bf16(static_cast<float>(scale));
  init.offset = static_cast<float>(offset);
  return init;
}

// Element i as fp32. u has 24 random bits; truncated to 16 (15 magnitude bits) and multiplied by an
// 8-bit scale, the product is exact, so the one rounding left (offset + product) is the same on every
// compiler and with or without FMA contraction.
MD_HOST_DEVICE inline float synthetic_value(uint64_t seed, const SyntheticInit& init, uint64_t i) {
  const float u = uniform_at(seed, init.id, i);
  const float u16 = static_cast<float>(static_cast<int32_t>(u * 32768.0f)) * (1.0f / 32768.0f);
  return init.offset + init.scale * u16;
}

MD_HOST_DEVICE inline uint16_t synthetic_bf16(uint64_t seed, const SyntheticInit& init, uint64_t i) {
  return float_to_bf16_bits(synthetic_value(seed, init, i));
}

// FNV-1a (64-bit) of the tensor name: the stream id of its random numbers. Host only.
constexpr uint64_t synthetic_tensor_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace megadecode
