// Host entry points of the kernels only the GPU tests launch: standalone launchers of device
// routines production runs inside larger kernels (SiLU*up, the MoE combine, the packed synthetic
// fill), each checked against a CPU reference.
// One launch each, asynchronous on `stream`. Invalid shapes or arguments
// are a megadecode::Error naming the argument.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>


namespace megadecode::cuda {

// ---- weights (cuda/common/weight_pack.cuh) ----
// Writes packed weights directly: element (row, k) = bf16(scale * uniform_at(seed, stream_id, row*k_total + k)),
// i.e. the same values as a row-major tensor filled from uniform_at and then packed.
void fill_packed_uniform(uint16_t* packed, int n_rows, int k, uint64_t seed, uint64_t stream_id, float scale,
                         cudaStream_t stream);

// ---- MoE pieces (cuda/common/moe.cuh) ----
// out[r][i] = bf16( silu(gate_up[r][i]) * gate_up[r][inter + i] ), gate_up [n_rows][gate_up_stride] fp32.
void silu_mul(const float* gate_up, int gate_up_stride, uint16_t* out, int out_stride, int n_rows, int inter,
              cudaStream_t stream);
// out[t][h] = residual[t][h] + sum_{k in 0..top_k-1, in order} w[t][k] * parts[t*top_k + k][h]
// (w == nullptr: weight 1). parts [n_tokens*top_k][n] fp32; residual/out [n_tokens][n] fp32 (may alias).
void moe_combine(const float* parts, const float* weights, const float* residual, float* out, int n_tokens, int top_k,
                 int n, cudaStream_t stream);

}  // namespace megadecode::cuda
