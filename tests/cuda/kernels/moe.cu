// Test-only standalone kernels for SiLU*up and the MoE combine (one launch each).
#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/moe.cuh"
#include "kernels.h"

namespace megadecode::cuda {
namespace {

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

}  // namespace

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
