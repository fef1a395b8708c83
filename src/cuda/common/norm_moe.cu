// Standalone kernels for RMSNorm and the router (one launch each): the prefill path's norms and top-k.
#include <algorithm>

#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernels.h"
#include "cuda/common/moe.cuh"  // router_topk_warp
#include "cuda/common/rms_norm.cuh"

namespace megadecode::cuda {
namespace {

template <typename T>
__global__ void rms_norm_kernel(const T* x, int x_stride, const uint16_t* weight, uint16_t* out, int out_stride, int n,
                                float eps) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  rms_norm_row(x + r * x_stride, weight, out + r * out_stride, n, eps, scratch);
}

template <bool kSigmoid>
__global__ void router_kernel(const float* logits, int stride, int n_tokens, int n_experts, int top_k, bool renorm,
                              int32_t* ids, float* weights) {
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= n_tokens) return;
  if constexpr (kSigmoid)
    router_sigmoid_topk_warp(logits + int64_t(t) * stride, n_experts, top_k, renorm, ids + int64_t(t) * top_k,
                             weights + int64_t(t) * top_k);
  else
    router_topk_warp(logits + int64_t(t) * stride, n_experts, top_k, renorm, ids + int64_t(t) * top_k,
                     weights + int64_t(t) * top_k);
}

template <typename T>
void launch_rms_norm(const T* x, int x_stride, const uint16_t* weight, uint16_t* out, int out_stride, int n_rows, int n,
                     float eps, cudaStream_t stream) {
  MD_REQUIRE(n_rows >= 0 && n > 0, "rms_norm: bad shape [", n_rows, ", ", n, "]");
  MD_REQUIRE(x_stride >= n && out_stride >= n, "rms_norm: strides must be >= n");
  if (n_rows == 0) return;
  rms_norm_kernel<<<n_rows, 256, 0, stream>>>(x, x_stride, weight, out, out_stride, n, eps);
  CUDA_CHECK_LAST();
}

}  // namespace

void rms_norm(const uint16_t* x, int x_stride, const uint16_t* weight, uint16_t* out, int out_stride, int n_rows, int n,
              float eps, cudaStream_t stream) {
  launch_rms_norm(x, x_stride, weight, out, out_stride, n_rows, n, eps, stream);
}

void rms_norm(const float* x, int x_stride, const uint16_t* weight, uint16_t* out, int out_stride, int n_rows, int n,
              float eps, cudaStream_t stream) {
  launch_rms_norm(x, x_stride, weight, out, out_stride, n_rows, n, eps, stream);
}

void router_topk(const float* logits, int logits_stride, int n_tokens, int n_experts, int top_k, bool renormalize,
                 int32_t* expert_ids, float* expert_weights, cudaStream_t stream, bool sigmoid) {
  MD_REQUIRE(n_experts >= 1 && n_experts <= kRouterMaxExperts, "router_topk: n_experts ", n_experts, " outside 1..",
             kRouterMaxExperts);
  MD_REQUIRE(top_k >= 1 && top_k <= n_experts && top_k <= kRouterMaxTopK, "router_topk: top_k ", top_k,
             " outside 1..min(n_experts, ", kRouterMaxTopK, ")");
  MD_REQUIRE(logits_stride >= n_experts, "router_topk: logits_stride < n_experts");
  if (n_tokens <= 0) return;
  constexpr int kWarps = 4;
  const dim3 grid((n_tokens + kWarps - 1) / kWarps), block(32 * kWarps);
  if (sigmoid)
    router_kernel<true><<<grid, block, 0, stream>>>(logits, logits_stride, n_tokens, n_experts, top_k, renormalize,
                                                    expert_ids, expert_weights);
  else
    router_kernel<false><<<grid, block, 0, stream>>>(logits, logits_stride, n_tokens, n_experts, top_k, renormalize,
                                                     expert_ids, expert_weights);
  CUDA_CHECK_LAST();
}

void capture_dense_routing(int32_t* ids, float* weights, int layer, int n_layers, int top_k, int rows,
                           cudaStream_t stream) {
  MD_REQUIRE(ids && weights && layer >= 0 && layer < n_layers && top_k >= 1 && rows >= 0,
             "capture_dense_routing: bad arguments");
  if (rows == 0) return;
  const size_t row = static_cast<size_t>(n_layers) * top_k;
  CUDA_CHECK(cudaMemset2DAsync(ids + static_cast<size_t>(layer) * top_k, row * sizeof(int32_t), 0xff,
                               top_k * sizeof(int32_t), rows, stream));
  CUDA_CHECK(cudaMemset2DAsync(weights + static_cast<size_t>(layer) * top_k, row * sizeof(float), 0,
                               top_k * sizeof(float), rows, stream));
}

__global__ void scale_kernel(float* x, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= scale;
}

void scale_floats(float* x, int64_t n, float scale, cudaStream_t stream) {
  MD_REQUIRE(x != nullptr && n >= 0, "scale_floats: bad arguments");
  if (n == 0) return;
  scale_kernel<<<static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096)), 256, 0, stream>>>(x, n, scale);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda
