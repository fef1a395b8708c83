// Prefill GEMM on tensor cores over the PACKED weights: weights are the mma.sync m16n8k16 A operand
// (their 512-byte fragment tiles load with one conflict-free 16-byte shared load per lane), tokens
// the B operand. CTA tile: 128 weight rows x 128 tokens, 8 warps as 2 (rows) x 4 (tokens), each
// warp 64 rows x 32 tokens (4 x 4 MMAs per k16 step). K streams in stages of 64 through a 3-deep
// cp.async ring (16 KB of weights + 18 KB of activations per stage), so loads of stage s+2 overlap
// the math of stage s. At 2K tokens a weight byte feeds 128 tokens (~64 flop/byte from L2), which
// keeps the full-shape projections compute-bound.
// Epilogue through shared memory (coalesced stores): fp32 store, fp32 + residual, or SiLU(gate)*up.
// Grouped mode: each CTA row runs one (expert, slot range) tile of the device-built list.
// Determinism: each output is one warp's MMA chain over k in increasing order; no atomics.
#include <mutex>

#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/moe.cuh"
#include "cuda/common/packed_mma.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/weight_pack.cuh"
#include "cuda/prefill/prefill_kernels.h"

namespace megadecode::cuda::prefill {
namespace {

constexpr int kRb = kGemmTileRows / kPackRows;            // 8 row blocks per tile
constexpr int kKb = kGemmStageK / kPackK;                 // 4 k blocks per stage
constexpr int kWBytes = kRb * kKb * kPackTileBytes;       // 16 KB of weights per stage
constexpr int kXPitch = kGemmStageK * 2 + 16;             // 144 B per token row: ldmatrix conflict-free
constexpr int kXBytes = kGemmTileTokens * kXPitch;        // 18 KB of activations per stage
constexpr int kStageBytes = kWBytes + kXBytes;
constexpr int kRowsOffset = kGemmStages * kStageBytes;    // int64 X row offsets of the tile's tokens
constexpr int kSmemBytes = kRowsOffset + kGemmTileTokens * 8;
constexpr int kCPitch = kGemmTileRows + 4;                // epilogue staging [token][row] fp32
static_assert(kGemmTileTokens * kCPitch * 4 <= kRowsOffset, "epilogue staging must fit in the stage ring");
static_assert(kGemmThreads == 256 && kGemmTileRows == 128 && kGemmTileTokens == 128, "warp layout below");

// Issues stage `s` (k blocks [4s, 4s + 4)) into ring slot `slot`: 1024 16-byte chunks of weights
// and 1024 of activations, 4 + 4 per thread. Out-of-range chunks are zero-filled (src-size 0).
__device__ __forceinline__ void load_stage(uint8_t* smem, int slot, int s, const uint16_t* w, int rb0, int n_rb,
                                           int n_kb, const uint16_t* x, const int64_t* x_rows, int n_tok, int k) {
  uint8_t* st = smem + slot * kStageBytes;
  const int kb0 = s * kKb;
#pragma unroll
  for (int i = 0; i < (kRb * kKb * 32) / kGemmThreads; ++i) {
    const int c = threadIdx.x + i * kGemmThreads;
    const int rbl = c / (kKb * 32), kbl = (c / 32) % kKb, part = c % 32;
    const int rb = rb0 + rbl, kb = kb0 + kbl;
    const bool ok = rb < n_rb && kb < n_kb;
    const uint16_t* src = ok ? w + (static_cast<int64_t>(rb) * n_kb + kb) * (kPackRows * kPackK) + part * 8 : w;
    ptx::cp_async_16(st + (rbl * kKb + kbl) * kPackTileBytes + part * 16, src, ok ? 16 : 0);
  }
#pragma unroll
  for (int i = 0; i < (kGemmTileTokens * 8) / kGemmThreads; ++i) {
    const int c = threadIdx.x + i * kGemmThreads;
    const int tl = c / 8, part = c % 8;
    const int kk = kb0 * kPackK + part * 8;
    const bool ok = tl < n_tok && kk < k;
    const uint16_t* src = ok ? x + x_rows[tl] + kk : x;
    ptx::cp_async_16(st + kWBytes + tl * kXPitch + part * 16, src, ok ? 16 : 0);
  }
}

template <GemmEpilogue kEpi>
__global__ void __launch_bounds__(kGemmThreads) gemm_kernel(const GemmArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  int tok0 = 0, n_tok = 0;
  const uint16_t* w = a.w;
  if (a.tiles != nullptr) {
    if (static_cast<int>(blockIdx.y) >= *a.n_tiles) return;  // uniform per CTA, before any barrier
    const MoeTile t = a.tiles[blockIdx.y];
    w += t.expert * a.w_expert_stride;
    tok0 = t.slot0;
    n_tok = t.n;
  } else {
    tok0 = blockIdx.y * kGemmTileTokens;
    n_tok = min(kGemmTileTokens, a.n_tokens - tok0);
  }
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int warp_m = warp & 1, warp_n = warp >> 1;
  const int n_rb = static_cast<int>(pack_row_blocks(a.n_rows)), n_kb = static_cast<int>(pack_k_blocks(a.k));
  const int rb0 = blockIdx.x * kRb;
  int64_t* x_rows = reinterpret_cast<int64_t*>(smem + kRowsOffset);
  if (tid < kGemmTileTokens) {
    const int64_t row = tid < n_tok ? (a.gather != nullptr ? a.gather[tok0 + tid] : tok0 + tid) : 0;
    x_rows[tid] = row * a.x_stride;
  }
  __syncthreads();

  float acc[4][4][4];
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.0f;

  const int n_st = gemm_k_stages(a.k);
#pragma unroll
  for (int s = 0; s < kGemmStages - 1; ++s) {
    if (s < n_st) load_stage(smem, s, s, w, rb0, n_rb, n_kb, a.x, x_rows, n_tok, a.k);
    ptx::cp_async_commit();  // empty groups keep the wait count uniform
  }
  for (int s = 0; s < n_st; ++s) {
    ptx::cp_async_wait<kGemmStages - 2>();
    __syncthreads();  // stage s landed for every thread; slot (s - 1) % kStages is free again
    const int nxt = s + kGemmStages - 1;
    if (nxt < n_st) load_stage(smem, nxt % kGemmStages, nxt, w, rb0, n_rb, n_kb, a.x, x_rows, n_tok, a.k);
    ptx::cp_async_commit();
    const uint8_t* st = smem + (s % kGemmStages) * kStageBytes;
#pragma unroll
    for (int kk = 0; kk < kKb; ++kk) {
      uint32_t b0[4], b1[4];
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        // Matrices: (tokens +0..7, k 0..7), (+0..7, k 8..15), (+8..15, k 0..7), (+8..15, k 8..15).
        const int tl = warp_n * 32 + jj * 16 + (lane >> 4) * 8 + (lane & 7);
        uint32_t r[4];
        ptx::ldmatrix_x4(r, st + kWBytes + tl * kXPitch + kk * 32 + ((lane >> 3) & 1) * 16);
        b0[2 * jj] = r[0];
        b1[2 * jj] = r[1];
        b0[2 * jj + 1] = r[2];
        b1[2 * jj + 1] = r[3];
      }
      packed_mma_k16<4, 4>(acc, [&](int m) { return st + ((warp_m * 4 + m) * kKb + kk) * kPackTileBytes; }, b0, b1);
    }
  }
  ptx::cp_async_wait<0>();
  __syncthreads();  // the ring is reused as the epilogue's staging tile

  // Stage C[token][row] (fp32); lane (g, t) owns rows g, g+8 and tokens 2t, 2t+1 of each MMA.
  float* c = reinterpret_cast<float*>(smem);
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = warp_m * 64 + m * 16 + g + (e >= 2 ? 8 : 0);
        const int tl = warp_n * 32 + j * 8 + 2 * t4 + (e & 1);
        c[tl * kCPitch + row] = acc[m][j][e];
      }
  __syncthreads();
  if constexpr (kEpi == GemmEpilogue::kSwiGlu) {
    uint16_t* y = static_cast<uint16_t*>(a.y);
    const int n_cols = a.n_rows / 2;
    for (int idx = tid; idx < kGemmTileTokens * (kGemmTileRows / 2); idx += kGemmThreads) {
      const int tl = idx / (kGemmTileRows / 2), cl = idx % (kGemmTileRows / 2);
      const int col = blockIdx.x * (kGemmTileRows / 2) + cl;
      if (tl >= n_tok || col >= n_cols) continue;
      const int r = (cl / 8) * 16 + cl % 8;  // gate row of this column in the tile; up is r + 8
      const float gate = c[tl * kCPitch + r], up = c[tl * kCPitch + r + 8];
      y[static_cast<int64_t>(tok0 + tl) * a.y_stride + col] = float_to_bf16_bits(silu(gate) * up);
    }
  } else {
    float* y = static_cast<float*>(a.y);
    for (int idx = tid; idx < kGemmTileTokens * kGemmTileRows; idx += kGemmThreads) {
      const int tl = idx / kGemmTileRows, r = idx % kGemmTileRows;
      const int row = blockIdx.x * kGemmTileRows + r;
      if (tl >= n_tok || row >= a.n_rows) continue;
      const int64_t out = static_cast<int64_t>(tok0 + tl);
      float v = c[tl * kCPitch + r];
      if constexpr (kEpi == GemmEpilogue::kResidual) v = a.residual[out * a.residual_stride + row] + v;
      y[out * a.y_stride + row] = v;
    }
  }
}

template <GemmEpilogue kEpi>
void launch(const GemmArgs& a, cudaStream_t stream) {
  static std::once_flag configured;
  std::call_once(configured, [] {
    CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel<kEpi>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  });
  const int rows_y = a.tiles != nullptr ? a.tile_capacity : gemm_token_tiles(a.n_tokens);
  const dim3 grid(gemm_row_tiles(a.n_rows), rows_y);
  gemm_kernel<kEpi><<<grid, kGemmThreads, kSmemBytes, stream>>>(a);
  CUDA_CHECK_LAST();
}

}  // namespace

void gemm(const GemmArgs& a, GemmEpilogue epilogue, cudaStream_t stream) {
  MD_REQUIRE(a.w != nullptr && a.x != nullptr && a.y != nullptr, "prefill gemm: null operand");
  MD_REQUIRE(a.n_rows > 0 && a.k > 0 && a.k % 16 == 0, "prefill gemm: shape [", a.n_rows, ", ", a.k,
             "] needs rows > 0 and k a positive multiple of 16");
  MD_REQUIRE(a.x_stride >= a.k && a.x_stride % 8 == 0, "prefill gemm: x_stride ", a.x_stride,
             " must be >= k and a multiple of 8");
  MD_REQUIRE(reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0,
             "prefill gemm: x and w must be 16-byte aligned");
  const int out_cols = epilogue == GemmEpilogue::kSwiGlu ? a.n_rows / 2 : a.n_rows;
  MD_REQUIRE(a.y_stride >= out_cols, "prefill gemm: y_stride ", a.y_stride, " < ", out_cols, " output columns");
  if (epilogue == GemmEpilogue::kSwiGlu)
    MD_REQUIRE(a.n_rows % 16 == 0, "prefill gemm: a fused gate/up matrix has a multiple of 16 rows, got ", a.n_rows);
  if (epilogue == GemmEpilogue::kResidual)
    MD_REQUIRE(a.residual != nullptr && a.residual != a.y && a.residual_stride >= a.n_rows,
               "prefill gemm: residual must be given, not alias y, and have stride >= rows");
  if (a.tiles != nullptr) {
    MD_REQUIRE(a.n_tiles != nullptr && a.tile_capacity >= 1 && a.tile_capacity <= 65535,
               "prefill gemm: grouped mode needs n_tiles and a tile capacity in 1..65535, got ", a.tile_capacity);
  } else {
    MD_REQUIRE(a.n_tokens >= 0 && gemm_token_tiles(a.n_tokens) <= 65535, "prefill gemm: ", a.n_tokens, " tokens");
    if (a.n_tokens == 0) return;
  }
  switch (epilogue) {
    case GemmEpilogue::kStore: return launch<GemmEpilogue::kStore>(a, stream);
    case GemmEpilogue::kResidual: return launch<GemmEpilogue::kResidual>(a, stream);
    case GemmEpilogue::kSwiGlu: return launch<GemmEpilogue::kSwiGlu>(a, stream);
  }
}

}  // namespace megadecode::cuda::prefill
