// Host entry points of the standalone kernels: one launch each, asynchronous on `stream`,
// graph-capturable. The prefill path and the batched step (rms_norm, router_topk, sample_tokens), the device weights
// (pack_weight) and the GEMM benchmark call them; their device code is the cuda/common/*.cuh
// routine each names, which the megakernel runs per tile.
// Invalid shapes or arguments are a megadecode::Error naming the argument.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "sampling/params.h"

namespace megadecode::cuda {

// ---- weights (weight_pack.cuh) ----
// packed[packed_elements(n_rows, k)] bf16 <- w[n_rows][k] bf16 row-major; padding zero-filled.
void pack_weight(const uint16_t* w, uint16_t* packed, int n_rows, int k, cudaStream_t stream);

// ---- normalisation (rms_norm.cuh) ----
// out[r][:] = bf16( bf16(x[r][:] * rsqrt(mean(x[r]^2) + eps)) * weight ), fp32 statistics.
// x: [n_rows][x_stride] (bf16 or fp32), weight [n] bf16, out [n_rows][out_stride] bf16.
void rms_norm(const uint16_t* x, int x_stride, const uint16_t* weight, uint16_t* out, int out_stride, int n_rows,
              int n, float eps, cudaStream_t stream);
void rms_norm(const float* x, int x_stride, const uint16_t* weight, uint16_t* out, int out_stride, int n_rows, int n,
              float eps, cudaStream_t stream);

// ---- MoE pieces (moe.cuh) ----
// Per token: p = softmax(logits) in fp32 over n_experts; the top_k largest (ties to the lower index)
// in descending order; weights p (divided by their sum, summed in top-k order, when renormalize).
// sigmoid: the top_k largest logits instead, weights sigmoid(logit) (RouterKind::kSigmoidTopK);
// a NaN logit gives ids -1.
void router_topk(const float* logits, int logits_stride, int n_tokens, int n_experts, int top_k, bool renormalize,
                 int32_t* expert_ids, float* expert_weights, cudaStream_t stream, bool sigmoid = false);

// Routing capture of a dense layer (a parallel block's FFN without routing) for `rows` token rows:
// ids[r][layer][*] = -1 and weights 0, as cpu-mk records it. ids / weights: [rows][n_layers][top_k].
void capture_dense_routing(int32_t* ids, float* weights, int layer, int n_layers, int top_k, int rows,
                           cudaStream_t stream);

// x[0..n) *= scale (cohere2_moe's logit_scale on the LM head's fp32 logits; the megakernel's
// epilogue multiplies the same fp32 dot product).
void scale_floats(float* x, int64_t n, float scale, cudaStream_t stream);

// ---- sampling (sampling.cuh) ----
// tokens[r] = sample_row's token for logits[r][0..vocab) under params[r] (device memory; the
// penalties are the host's, not read here) at positions[r] (the position the sampled token takes;
// < 0: a padding row, token -1), one CTA of `threads` threads per row: 256 is the megakernel's
// consumer count (what its SAMPLE op runs), 1024 a standalone CTA. Token masks (structured output):
// with mask_slots non-null, a row r with mask_slots[r] >= 0 samples only among the tokens its mask
// allows, masks + mask_slots[r] * ceil(vocab / 32) (packed words, sampling/token_mask.h); null: no
// row is constrained and nothing more is read.
void sample_tokens(const float* logits, int logits_stride, int n_rows, int vocab, const SamplingParams* params,
                   const int64_t* positions, int32_t* tokens, int threads, cudaStream_t stream,
                   const int32_t* mask_slots = nullptr, const uint32_t* masks = nullptr);

// ---- logprobs (logprobs.cu) ----
// The most top logprobs a row gets on the device (the server's limit, vLLM's default).
constexpr int kMaxTopLogprobs = 20;
struct RowLogprobs {
  int32_t token;                      // the row's sampled token
  float logprob;                      // log_softmax(logits)[token]
  int32_t ids[kMaxTopLogprobs];       // the most likely tokens, best first (ties: lower id)
  float logprobs[kMaxTopLogprobs];
};
// out[r] for r < n_rows: engine/logits.h token_logprob(logits row r, tokens[r], kMaxTopLogprobs)
// (NaN and -inf as it gives them; the normaliser summed in another order: to ~1e-6), one CTA a row.
void row_logprobs(const float* logits, int logits_stride, int n_rows, int vocab, const int32_t* tokens,
                  RowLogprobs* out, cudaStream_t stream);

// ---- chained steps (the overlapped loop: engine/backend.h, DecodeSeq::prev_row) ----
// tokens[i] < 0 (i < n) becomes chain[-1 - tokens[i]]: the token the previous step sampled for
// that row, which the host has not seen yet. Device memory both.
void resolve_chained_tokens(int32_t* tokens, int n, const int32_t* chain, cudaStream_t stream);

}  // namespace megadecode::cuda

