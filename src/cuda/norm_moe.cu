// Standalone kernels for RMSNorm, the router, SiLU*up and the MoE combine (one launch each).
#include "core/check.h"
#include "cuda/cuda_check.h"
#include "cuda/ops.h"
#include "cuda/ops/moe.cuh"
#include "cuda/ops/rms_norm.cuh"

namespace megadecode::cuda {
namespace {

template <typename T>
__global__ void rms_norm_kernel(const T* x, int x_stride, const uint16_t* weight, uint16_t* out, int out_stride, int n,
                                float eps) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  rms_norm_row(x + r * x_stride, weight, out + r * out_stride, n, eps, scratch);
}

__global__ void router_kernel(const float* logits, int stride, int n_tokens, int n_experts, int top_k, bool renorm,
                              int32_t* ids, float* weights) {
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= n_tokens) return;
  router_topk_warp(logits + int64_t(t) * stride, n_experts, top_k, renorm, ids + int64_t(t) * top_k,
                   weights + int64_t(t) * top_k);
}

__global__ void silu_mul_kernel(const float* gate_up, int stride, uint16_t* out, int out_stride, int inter) {
  const int64_t r = blockIdx.y;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < inter; i += gridDim.x * blockDim.x) {
    const float g = gate_up[r * stride + i], u = gate_up[r * stride + inter + i];
    out[r * out_stride + i] = float_to_bf16_bits(silu(g) * u);
  }
}

__global__ void combine_kernel(const float* parts, const float* weights, const float* residual, float* out, int top_k,
                               int n) {
  const int64_t t = blockIdx.y;
  for (int h = blockIdx.x * blockDim.x + threadIdx.x; h < n; h += gridDim.x * blockDim.x) {
    float s = 0.0f;
    for (int k = 0; k < top_k; ++k) {
      const float w = weights != nullptr ? weights[t * top_k + k] : 1.0f;
      s += w * parts[(t * top_k + k) * n + h];
    }
    out[t * n + h] = residual[t * n + h] + s;
  }
}

void check_rms(int x_stride, int out_stride, int n_rows, int n) {
  MD_REQUIRE(n_rows >= 0 && n > 0, "rms_norm: bad shape [", n_rows, ", ", n, "]");
  MD_REQUIRE(x_stride >= n && out_stride >= n, "rms_norm: strides must be >= n");
}

}  // namespace

void rms_norm(const uint16_t* x, int x_stride, const uint16_t* weight, uint16_t* out, int out_stride, int n_rows, int n,
              float eps, cudaStream_t stream) {
  check_rms(x_stride, out_stride, n_rows, n);
  if (n_rows == 0) return;
  rms_norm_kernel<<<n_rows, 256, 0, stream>>>(x, x_stride, weight, out, out_stride, n, eps);
  CUDA_CHECK_LAST();
}

void rms_norm(const float* x, int x_stride, const uint16_t* weight, uint16_t* out, int out_stride, int n_rows, int n,
              float eps, cudaStream_t stream) {
  check_rms(x_stride, out_stride, n_rows, n);
  if (n_rows == 0) return;
  rms_norm_kernel<<<n_rows, 256, 0, stream>>>(x, x_stride, weight, out, out_stride, n, eps);
  CUDA_CHECK_LAST();
}

void router_topk(const float* logits, int logits_stride, int n_tokens, int n_experts, int top_k, bool renormalize,
                 int32_t* expert_ids, float* expert_weights, cudaStream_t stream) {
  MD_REQUIRE(n_experts >= 1 && n_experts <= kRouterMaxExperts, "router_topk: n_experts ", n_experts, " outside 1..",
             kRouterMaxExperts);
  MD_REQUIRE(top_k >= 1 && top_k <= n_experts && top_k <= kRouterMaxTopK, "router_topk: top_k ", top_k,
             " outside 1..min(n_experts, ", kRouterMaxTopK, ")");
  MD_REQUIRE(logits_stride >= n_experts, "router_topk: logits_stride < n_experts");
  if (n_tokens <= 0) return;
  constexpr int kWarps = 4;
  router_kernel<<<(n_tokens + kWarps - 1) / kWarps, 32 * kWarps, 0, stream>>>(logits, logits_stride, n_tokens, n_experts,
                                                                           top_k, renormalize, expert_ids, expert_weights);
  CUDA_CHECK_LAST();
}

void silu_mul(const float* gate_up, int gate_up_stride, uint16_t* out, int out_stride, int n_rows, int inter,
              cudaStream_t stream) {
  MD_REQUIRE(inter > 0 && gate_up_stride >= 2 * inter && out_stride >= inter, "silu_mul: bad strides");
  MD_REQUIRE(n_rows >= 0 && n_rows <= 65535, "silu_mul: n_rows ", n_rows, " outside 0..65535");
  if (n_rows == 0) return;
  silu_mul_kernel<<<dim3((inter + 255) / 256, n_rows), 256, 0, stream>>>(gate_up, gate_up_stride, out, out_stride, inter);
  CUDA_CHECK_LAST();
}

void moe_combine(const float* parts, const float* weights, const float* residual, float* out, int n_tokens, int top_k,
                 int n, cudaStream_t stream) {
  MD_REQUIRE(top_k >= 1 && n > 0, "moe_combine: top_k ", top_k, ", n ", n);
  MD_REQUIRE(n_tokens >= 0 && n_tokens <= 65535, "moe_combine: n_tokens ", n_tokens, " outside 0..65535");
  if (n_tokens == 0) return;
  combine_kernel<<<dim3((n + 255) / 256, n_tokens), 256, 0, stream>>>(parts, weights, residual, out, top_k, n);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda
