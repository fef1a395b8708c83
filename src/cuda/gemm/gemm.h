// The many-row GEMM engine: Y[token][row] = sum_k W[row][k] X[token][k] over PACKED weights
// (weight_pack.cuh), for 1..thousands of activation rows ("tokens"): the batched decode step's dense
// projections (QKV, O, router, LM head) and grouped expert GEMMs, and the prefill pieces'.
// One persistent kernel per call (one CTA per SM walking work tiles, gemm_plan.h): a producer warp
// streams each tile's weight row blocks (cp.async.bulk, evict-first) and activation rows (TMA boxes
// of contiguous rows: callers put a grouped GEMM's rows in slot order first) through a ring of
// shared-memory stages, completing on mbarriers; two consumer warpgroups run wgmma m64nNk16 (bf16 in, fp32
// accumulate) and apply the epilogue from registers.
// Grouped mode: the tile list (expert, slot range) and its count live on the device (built by the
// MoE lists kernel), so the host never waits for the routing; each active expert's weights are read
// once per tile column, and a column holds about twice the mean rows per expert.
// Split K (dense only, `k_splits` > 1): partial sums go to `workspace`; the last of a tile's
// splits to arrive adds them in split order and runs the epilogue.
// Determinism: see gemm_plan.h. Threading: launches are asynchronous on `stream`, graph-capturable.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/gemm/gemm_plan.h"

namespace megadecode::cuda::gemm {

enum class Epilogue {
  kStore,     // y fp32 [tokens][y_stride]
  kResidual,  // y fp32 = residual fp32 + W x (y and residual may not alias)
  kSwiGlu,    // W is a fused gate/up matrix (row block j: gate rows 8j..8j+7, up rows 8j..8j+7):
              // y bf16 [tokens][y_stride], n_rows / 2 columns of SiLU(gate) * up
};

struct GemmArgs {
  const uint16_t* w = nullptr;  // packed [ceil(n_rows/16)][ceil(k/16)][16x16] bf16; grouped: expert 0's
  int64_t w_expert_stride = 0;  // grouped: packed elements between consecutive experts' matrices
  int n_experts = 0;            // grouped: the matrices w holds (every tile's expert is below it)
  int n_rows = 0;               // weight rows = output features
  int k = 0;                    // a multiple of 16
  const uint16_t* x = nullptr;  // bf16 activation rows [*][x_stride], 16-byte aligned
  int x_stride = 0;             // elements, a multiple of 8
  int n_tokens = 0;             // dense: output tokens [0, n_tokens), token i reading X row i
  // Grouped mode (tiles != nullptr): tile column c < *n_tiles is tiles[c]; output token i of it is
  // slot slot0 + i; the weight matrix is w + expert * w_expert_stride. token_groups must be the
  // tile size the list was built with (tiles of at most 8 * token_groups slots).
  const MoeTile* tiles = nullptr;
  const int32_t* n_tiles = nullptr;  // device scalar
  int tile_capacity = 0;        // entries of `tiles` (moe_tile_capacity)
  int x_rows = 0;               // grouped: rows of X the tiles may read (the slots); rows past it read as 0
  int token_groups = 0;         // dense: 0 picks dense_tile_groups(...); grouped: required
  void* y = nullptr;            // [tokens][y_stride]
  int y_stride = 0;             // elements
  const float* residual = nullptr;  // kResidual: [tokens][residual_stride]
  int residual_stride = 0;
  int k_splits = 1;             // dense: split K this many ways (dense_k_splits); grouped: 1
  float* workspace = nullptr;   // k_splits > 1: workspace_floats(...) floats
  int32_t* semaphores = nullptr;  // k_splits > 1: semaphore_count(...) ints, zero before the first call
};

// Workspace of a split dense GEMM of n_tokens x n_rows (k_splits > 1; token_groups as resolved:
// dense_tile_groups(n_rows, n_tokens, k_splits, SMs) when the args leave it 0); the semaphores are
// left zero by every call, so one zeroing at allocation serves every later call.
size_t workspace_floats(int n_tokens, int n_rows, int token_groups, int k_splits);
size_t semaphore_count(int n_tokens, int n_rows, int token_groups);

// Error (naming the argument) for a bad shape, alignment or mode; then one launch on `stream`.
void gemm(const GemmArgs& args, Epilogue epilogue, cudaStream_t stream);

// A dense SwiGLU MLP over n_tokens rows (a parallel block's dense layer): mid = SiLU(gate) * up
// (bf16 [n_tokens][inter], w_up the fused gate/up matrix as kSwiGlu takes it, packed [2 * inter][k])
// then y = W_down mid (fp32 [n_tokens][n_out], w_down packed [n_out][inter]). Two launches, no split K.
void swiglu_mlp(const uint16_t* w_up, const uint16_t* w_down, int k, int inter, int n_out, const uint16_t* x,
                int x_stride, int n_tokens, uint16_t* mid, float* y, cudaStream_t stream);

}  // namespace megadecode::cuda::gemm
