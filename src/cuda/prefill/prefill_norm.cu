// Prefill norms, one CTA per token: the layer's input norm with its prologue (the embedding row at
// layer 0, else the previous layer's MoE combine: h + sum_k w_k * down_k in k order, the decode
// megakernel's order), and the final norm (same prologue, last token only). The MoE combine is
// fused here so the residual stream is written once per layer and no float atomics are needed.
#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/rms_norm.cuh"
#include "cuda/prefill/prefill_kernels.h"

namespace megadecode::cuda::prefill {
namespace {

constexpr int kThreads = 256;
constexpr int kPer = 16;  // hidden <= 16 * 256

__global__ void __launch_bounds__(kThreads) residual_norm_kernel(const ResidualNormArgs a) {
  __shared__ float scratch[32];
  const int t = a.token_begin + blockIdx.x;
  const int H = a.hidden;
  float v[kPer];
  if (a.embed != nullptr) {
    const int32_t tok = a.tokens[t];
    if (tok < 0 || tok >= a.vocab) {  // uniform: every thread reads the same id
      if (threadIdx.x == 0) atomicCAS(a.error, 0, 1 + t);
      return;
    }
    const uint16_t* e = a.embed + static_cast<int64_t>(tok) * H;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * kThreads;
      v[j] = i < H ? bf16_bits_to_float(e[i]) : 0.0f;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPer; ++j) v[j] = 0.0f;
#pragma unroll 8  // the k expert rows' loads in flight together (the sum keeps k order)
    for (int k = 0; k < a.top_k; ++k) {
      const float wk = a.topk_w[t * a.top_k + k];
      const float* d = a.down + static_cast<int64_t>(a.token_slot[t * a.top_k + k]) * H;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int i = threadIdx.x + j * kThreads;
        if (i < H) v[j] += wk * d[i];
      }
    }
    const float* h = a.h + static_cast<int64_t>(t) * H;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * kThreads;
      v[j] = i < H ? h[i] + v[j] : 0.0f;
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i < H && a.x != nullptr) a.x[static_cast<int64_t>(t) * H + i] = v[j];
    ss += v[j] * v[j];  // v is 0 past H
  }
  const float r = rsqrtf(block_sum(ss, scratch) / static_cast<float>(H) + a.eps);
  uint16_t* out = a.out + static_cast<int64_t>(t - a.token_begin) * H;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i < H) out[i] = float_to_bf16_bits(round_bf16(v[j] * r) * bf16_bits_to_float(a.norm_w[i]));
  }
}

}  // namespace

void residual_norm(const ResidualNormArgs& a, cudaStream_t stream) {
  MD_REQUIRE(a.hidden > 0 && a.hidden <= kPer * kThreads, "prefill norm: hidden ", a.hidden, " outside 1..",
             kPer * kThreads);
  MD_REQUIRE(a.norm_w != nullptr && a.out != nullptr, "prefill norm: null weight or output");
  MD_REQUIRE(a.token_begin >= 0 && a.token_begin <= a.n_tokens, "prefill norm: token range [", a.token_begin, ", ",
             a.n_tokens, ")");
  if (a.embed != nullptr) {
    MD_REQUIRE(a.tokens != nullptr && a.vocab > 0 && a.error != nullptr, "prefill norm: embedding mode needs tokens");
  } else {
    MD_REQUIRE(a.h != nullptr && a.down != nullptr && a.token_slot != nullptr && a.topk_w != nullptr && a.top_k >= 1,
               "prefill norm: MoE mode needs h, down, token_slot, topk_w and top_k >= 1");
  }
  const int n = a.n_tokens - a.token_begin;
  if (n == 0) return;
  residual_norm_kernel<<<n, kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda::prefill
