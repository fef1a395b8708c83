// The many-row GEMM kernel (gemm.h): one persistent CTA per SM walks work tiles t = blockIdx.x,
// + gridDim.x, ... (gemm_plan.h numbering). Warp 8 (the producer) issues, per tile and k stage,
// the stage's weights (128-token tiles: one 4-D TMA box of the 8 row blocks x kStageKb k blocks;
// smaller tiles: one cp.async.bulk per row block, kStageKb x 512 contiguous bytes of the packed
// layout) and the stage's activation rows as TMA boxes of 64 k x the tile's tokens, 128-byte swizzled (a box's
// bytes whatever the tokens; rows and k outside X are zero-filled), into the next ring slot, all
// completing on full[slot] as transaction bytes. (Its previous form, a cp.async per 16-byte piece
// of every row, bound 128-token tiles by the producer's issue rate: 1,024 copies a stage.) The
// producer waits for empty[slot] before reusing a slot, so the weight stream runs ahead across
// tile boundaries.
// Warps 0..7 (the consumers, two warpgroups) wait full[slot], load their row block's A fragments, issue one
// wgmma per k block (N: the tile's tokens; a 128-token tile's 16-token groups that hold tokens),
// commit them as a group and wait for it before releasing the slot (the two
// warpgroups' groups overlap each other). At a tile's end the consumers store its epilogue from registers (lane (g, t)
// holds rows g and g + 8 and tokens 2t, 2t + 1 of each 8-token group). Nothing else synchronises
// the roles: the producer never waits for the consumers' epilogue, and the consumers meet only at
// named barrier 1 (split-K tiles).
#include <algorithm>
#include <mutex>

#include <cuda.h>

#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_info.h"
#include "cuda/common/moe.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/tensor_map.h"
#include "cuda/common/weight_pack.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/gemm/gemm.h"

namespace megadecode::cuda::gemm {
namespace {

constexpr int kHeaderBytes = 256;  // full[kMaxStages], empty[kMaxStages], the split flag
// The stages start at the first kStageAlign boundary past the header (a swizzled box's alignment).
constexpr int kSmemSlack = kHeaderBytes + kStageAlign;
constexpr int kFullArrivals = 1;   // the producer's expect_tx; the copies complete as bytes
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kSplitBar = 1;       // named barrier of the consumers

template <int kNT>
struct Cfg {
  static constexpr int kKB = stage_kb(kNT);
  static constexpr int kWBytes = stage_weight_bytes(kNT);
  static constexpr int kStage = stage_bytes(kNT);
  static constexpr int kTokens = 8 * kNT;
  static_assert(kConsumerWarps == kTileRowBlocks, "one row block per consumer warp");
  static_assert(kSplitUnitKb % kKB == 0, "a split unit is whole stages");
  static constexpr int kBoxes = stage_x_boxes(kNT);
  static constexpr int kBoxBytes = stage_x_box_bytes(kNT);
  static constexpr uint32_t kXBytes = kBoxes * kBoxBytes;  // a TMA stage's activation bytes
  static_assert(kWBytes % kStageAlign == 0 && kStage % kStageAlign == 0 && kBoxBytes % kStageAlign == 0,
                "every box starts on a swizzle atom");
};

// 128-token tiles take a stage's weights as one 4-D TMA box (8 row blocks x kKB k blocks): at 2048
// rows the dense GEMMs were bound by the producer's nine requests a stage (bulk copies: QKV 457,
// TMA box: 515 TFLOP/s). Smaller tiles keep one bulk copy per row block, which streams the decode
// step's weights faster (grouped gate/up at 1-16 rows per expert: 188 against 194 us).
template <int kNT>
constexpr bool kWeightBox = kNT == 16;

// What one work tile covers; decoded identically by the producer and the consumers.
struct Tile {
  const uint16_t* w;  // the matrix (grouped: the tile's expert)
  int expert;         // grouped: the tile's expert; dense 0
  int rb0, n_rb;      // packed row blocks [rb0, rb0 + n_rb)
  int kb0, kb1;       // packed k blocks
  int tok0, n_tok;    // output tokens [tok0, tok0 + n_tok)
  TileCoord c;
};

// The next ring slot; the phase parity flips each time the ring wraps.
__device__ __forceinline__ void advance_ring(int& slot, uint32_t& phase, int n_stages) {
  if (++slot == n_stages) {
    slot = 0;
    phase ^= 1;
  }
}

struct Shape {
  int row_tiles, n_rb, n_kb, splits, columns, band, total;
};

__device__ __forceinline__ Tile decode_tile(const GemmArgs& a, const Shape& s, int t, int tokens_per_tile) {
  Tile ti;
  ti.c = tile_coord(t, s.row_tiles, s.columns, s.splits, s.band);
  ti.rb0 = ti.c.row_tile * kTileRowBlocks;
  ti.n_rb = min(kTileRowBlocks, s.n_rb - ti.rb0);
  if (a.tiles != nullptr) {
    const MoeTile mt = a.tiles[ti.c.column];
    ti.w = a.w + mt.expert * a.w_expert_stride;
    ti.expert = mt.expert;
    ti.tok0 = mt.slot0;
    ti.n_tok = mt.n;
    ti.kb0 = 0;
    ti.kb1 = s.n_kb;
  } else {
    ti.w = a.w;
    ti.expert = 0;
    ti.tok0 = ti.c.column * tokens_per_tile;
    ti.n_tok = min(tokens_per_tile, a.n_tokens - ti.tok0);
    const KbRange r = split_kb_range(ti.c.split, s.splits, a.k);
    ti.kb0 = r.begin;
    ti.kb1 = r.end;
  }
  return ti;
}

template <int kNT>
__device__ __forceinline__ void produce(const GemmArgs& a, const CUtensorMap* w_map, const CUtensorMap* x_map, const Shape& s, uint8_t* stages,
                                        uint64_t* full, uint64_t* empty, int n_stages) {
  using C = Cfg<kNT>;
  const int lane = threadIdx.x & 31;
  const uint64_t policy = ptx::policy_evict_first();
  int slot = 0;
  uint32_t phase = 0;  // ring position: slot, and the parity of its passes
  for (int t = blockIdx.x; t < s.total; t += gridDim.x) {
    const Tile ti = decode_tile(a, s, t, C::kTokens);
    for (int kb = ti.kb0; kb < ti.kb1; kb += C::kKB, advance_ring(slot, phase, n_stages)) {
      ptx::mbar_wait(&empty[slot], phase ^ 1);
      uint8_t* st = stages + slot * C::kStage;
      if constexpr (kWeightBox<kNT>) {
        // The stage's weights as one box of the 8 row blocks x kKB k blocks (past the matrix: zeros).
        if (lane == 0) {
          ptx::mbar_arrive_expect_tx(&full[slot], C::kWBytes + C::kXBytes);
          ptx::tma_load_4d_hint(st, w_map, 0, kb, ti.rb0, ti.expert, &full[slot], policy);
        }
      } else {
        // One bulk copy per row block of the tile (kKB x 512 contiguous bytes, fewer at K's end).
        const int nkb = min(C::kKB, ti.kb1 - kb);
        const uint32_t w_bytes = static_cast<uint32_t>(nkb) * kPackTileBytes;
        if (lane == 0) ptx::mbar_arrive_expect_tx(&full[slot], w_bytes * ti.n_rb + C::kXBytes);
        __syncwarp();  // expect_tx precedes every bulk copy of the phase: it cannot complete early
        if (lane < ti.n_rb)
          ptx::bulk_g2s(st + lane * C::kKB * kPackTileBytes,
                        ti.w + (static_cast<int64_t>(ti.rb0 + lane) * s.n_kb + kb) * (kPackRows * kPackK), w_bytes,
                        &full[slot], policy);
      }
      // Every box of the stage, also past the tile's K (zero-filled: the consumers multiply them).
      if (lane == 0) {
#pragma unroll
        for (int b = 0; b < C::kBoxes; ++b)
          ptx::tma_load_2d(st + C::kWBytes + b * C::kBoxBytes, x_map, kb * kPackK + b * kXBoxK, ti.tok0, &full[slot]);
      }
    }
  }
}

// The descriptor of k block kk of a stage's activation boxes (x0: the first box).
template <int kNT>
__device__ __forceinline__ uint64_t stage_x_desc(uint32_t x0, int kk) {
  using C = Cfg<kNT>;
  return ptx::wgmma_desc_sw128(x0 + (kk * 16 / kXBoxK) * C::kBoxBytes + (kk * 16 % kXBoxK) * 2);
}

// One stage's wgmmas of a 128-token tile over its first 8 kN tokens, a whole wgmma group: fenced,
// committed and waited for inside (a group open across a branch serialises every wgmma: C7520).
template <int kN>
__device__ __forceinline__ void stage_mma(float (&acc)[16][4], const uint32_t (&frag)[Cfg<16>::kKB][4], uint32_t x0) {
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg<16>::kKB; ++kk) ptx::wgmma_bf16_rs_first<kN>(acc, frag[kk], stage_x_desc<16>(x0, kk));
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
}

template <int kNT, Epilogue kEpi>
__device__ __forceinline__ void consume(const GemmArgs& a, const Shape& s, uint8_t* stages, uint64_t* full,
                                        uint64_t* empty, int n_stages, int* split_flag) {
  using C = Cfg<kNT>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int my_rb = warp;  // this warp's row block
  // Accumulator (j, e) of lane (g, t4): tile row my_rb * 16 + g + 8 (e / 2), tile token 8 j + 2 t4 + e % 2.
  const auto acc_row = [&](int e) { return my_rb * 16 + g + 8 * (e >> 1); };
  const auto acc_token = [&](int j, int e) { return j * 8 + 2 * t4 + (e & 1); };
  int slot = 0;
  uint32_t phase = 0;
  for (int t = blockIdx.x; t < s.total; t += gridDim.x) {
    const Tile ti = decode_tile(a, s, t, C::kTokens);
    const bool active = ti.n_rb > my_rb;  // this warp's rows exist (uniform per warp)
    const int live16 = (ti.n_tok + 15) / 16;  // 16-token groups holding tokens (uniform per tile)
    float acc[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    ptx::wgmma_fence_operands(acc);
    for (int kb = ti.kb0; kb < ti.kb1; kb += C::kKB, advance_ring(slot, phase, n_stages)) {
      ptx::mbar_wait(&full[slot], phase);
      __syncwarp();  // converged for the .aligned wgmma instructions
      // Every warpgroup runs every k block of the stage, straight-line (a wgmma under a branch
      // serialises them all): a missing row block or k block multiplies zeros (its A fragment is
      // zero here; the activations past the tile's K are zero-filled boxes).
      const uint8_t* st = stages + slot * C::kStage;
      const int nkb = min(C::kKB, ti.kb1 - kb);
      uint32_t frag[C::kKB][4];
#pragma unroll
      for (int kk = 0; kk < C::kKB; ++kk) {
        uint4 f = make_uint4(0u, 0u, 0u, 0u);
        if (active && kk < nkb)
          f = *reinterpret_cast<const uint4*>(st + (my_rb * C::kKB + kk) * kPackTileBytes + lane * 16);
        frag[kk][0] = f.x;
        frag[kk][1] = f.y;
        frag[kk][2] = f.z;
        frag[kk][3] = f.w;
      }
      const uint32_t x0 = ptx::smem_addr(st + C::kWBytes);
      if constexpr (kNT == 16) {
        // 128-token tiles multiply only the 16-token groups holding tokens (an expert's tile of 70
        // tokens: 80, not 128). The time hardly moves (the stage feed binds, not the MMAs:
        // docs/perf/journal/2026-12.md, 2026-12-04); the tensor work does.
        switch (live16) {
          case 1: stage_mma<2>(acc, frag, x0); break;
          case 2: stage_mma<4>(acc, frag, x0); break;
          case 3: stage_mma<6>(acc, frag, x0); break;
          case 4: stage_mma<8>(acc, frag, x0); break;
          case 5: stage_mma<10>(acc, frag, x0); break;
          case 6: stage_mma<12>(acc, frag, x0); break;
          case 7: stage_mma<14>(acc, frag, x0); break;
          default: stage_mma<16>(acc, frag, x0); break;
        }
      } else {
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < C::kKB; ++kk) ptx::wgmma_bf16_rs<kNT>(acc, frag[kk], stage_x_desc<kNT>(x0, kk), 1);
        ptx::wgmma_commit();
        ptx::wgmma_wait<0>();
      }
      // The group is done before the slot is released and before the next stage's fragments are
      // loaded (the A registers of a pending wgmma may not be written).
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(&empty[slot]);
    }
    ptx::wgmma_fence_operands(acc);  // the accumulators are read only after the last wait

    if (s.splits > 1) {
      // This split's partial, then the last of the tile's splits to arrive adds all in split order.
      const int64_t block = static_cast<int64_t>(ti.c.column) * s.row_tiles + ti.c.row_tile;
      float* part = a.workspace + (block * s.splits) * (kTileRows * C::kTokens);
      const auto part_index = [&](int split, int j, int e) {
        return static_cast<int64_t>(split) * (kTileRows * C::kTokens) + acc_token(j, e) * kTileRows + acc_row(e);
      };
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[part_index(ti.c.split, j, e)] = acc[j][e];
      __threadfence();  // this thread's partial before the arrival (release, with the barrier)
      ptx::named_barrier_sync(kSplitBar, kConsumerThreads);
      if (threadIdx.x == 0) {
        const int old = atomicAdd(a.semaphores + block, 1);
        const bool last = old == s.splits - 1;
        if (last) a.semaphores[block] = 0;  // every split arrived: ready for the next call
        __threadfence();                    // acquire the other splits' partials
        *split_flag = last ? 1 : 0;
      }
      ptx::named_barrier_sync(kSplitBar, kConsumerThreads);
      const bool last = *split_flag != 0;  // read before the next tile's first barrier rewrites it
      if (!last) continue;
      __threadfence();
      // Split by split, fully unrolled so the loads of a split are in flight at once (one L2 round
      // trip per split, not one per element and split); each element adds 0 + p0 + p1 + ... in order.
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
      for (int sp = 0; sp < s.splits; ++sp) {
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[j][e] += __ldcg(part + part_index(sp, j, e));
      }
    }
    if (!active) continue;

    // Epilogue from registers.
    const int rb = ti.rb0 + my_rb;  // the matrix's packed row block
    if constexpr (kEpi == Epilogue::kSwiGlu) {
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const int col = rb * 8 + g;  // gate row g and up row g + 8 of the row block
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tl = acc_token(j, e);
          if (tl >= ti.n_tok || col >= a.n_rows / 2) continue;
          uint16_t* y = static_cast<uint16_t*>(a.y);
          y[static_cast<int64_t>(ti.tok0 + tl) * a.y_stride + col] = float_to_bf16_bits(silu(acc[j][e]) * acc[j][e + 2]);
        }
      }
    } else {
      // fp32 outputs (kStore, kResidual). kResidual: a chunk's residual loads are all issued before
      // its stores. Loads and stores interleaved cost one memory round trip per element (the
      // compiler cannot move a load above a store to y, which it must assume may alias). The
      // residual is read-only in this kernel (y never aliases it).
      constexpr int kChunk = kNT < 4 ? kNT : 4;
#pragma unroll
      for (int j0 = 0; j0 < kNT; j0 += kChunk) {
        float add[kChunk][4];
#pragma unroll
        for (int jj = 0; jj < kChunk; ++jj)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = ti.rb0 * 16 + acc_row(e), tl = acc_token(j0 + jj, e);
            add[jj][e] = 0.0f;
            if constexpr (kEpi == Epilogue::kResidual)
              if (tl < ti.n_tok && row < a.n_rows)
                add[jj][e] = __ldg(a.residual + static_cast<int64_t>(ti.tok0 + tl) * a.residual_stride + row);
          }
#pragma unroll
        for (int jj = 0; jj < kChunk; ++jj)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = ti.rb0 * 16 + acc_row(e), tl = acc_token(j0 + jj, e);
            if (tl >= ti.n_tok || row >= a.n_rows) continue;
            const float v = kEpi == Epilogue::kResidual ? add[jj][e] + acc[j0 + jj][e] : acc[j0 + jj][e];
            static_cast<float*>(a.y)[static_cast<int64_t>(ti.tok0 + tl) * a.y_stride + row] = v;
          }
      }
    }
  }
}

template <int kNT, Epilogue kEpi>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_kernel(const GemmArgs a, const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                const Shape shape_in, int n_stages) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kMaxStages;
  int* split_flag = reinterpret_cast<int*>(empty + kMaxStages);
  const uint32_t base = ptx::smem_addr(smem);
  uint8_t* stages = smem + ((base + kHeaderBytes + kStageAlign - 1) / kStageAlign * kStageAlign - base);
  Shape s = shape_in;
  if (a.tiles != nullptr) {  // the list was written by an earlier launch
    s.columns = *a.n_tiles;
    s.total = s.columns * s.row_tiles;
  }
  if (threadIdx.x == 0) {
    for (int i = 0; i < n_stages; ++i) {
      ptx::mbar_init(&full[i], kFullArrivals);
      ptx::mbar_init(&empty[i], kConsumerWarps);
    }
    ptx::fence_mbar_init();
  }
  if (threadIdx.x == kConsumerThreads) {
    ptx::prefetch_tensormap(&x_map);
    if constexpr (kWeightBox<kNT>) ptx::prefetch_tensormap(&w_map);
  }
  __syncthreads();
  if (threadIdx.x >= kConsumerThreads) {
    produce<kNT>(a, &w_map, &x_map, s, stages, full, empty, n_stages);
  } else {
    consume<kNT, kEpi>(a, s, stages, full, empty, n_stages, split_flag);
  }
}

// The TMA map of X's contiguous rows: [rows][k] bf16 with row pitch x_stride, boxes of 64 k x the
// tile's tokens, 128-byte swizzle. Rows past `rows` and k past `k` read as zeros.
CUtensorMap x_tensor_map(const GemmArgs& a, int rows, int tile_tokens) {
  const uint64_t dims[2] = {static_cast<uint64_t>(a.k), static_cast<uint64_t>(rows)};
  const uint64_t strides[1] = {static_cast<uint64_t>(a.x_stride) * 2};
  const uint32_t box[2] = {static_cast<uint32_t>(kXBoxK), static_cast<uint32_t>(tile_tokens)};
  return bf16_tensor_map_sw128(a.x, 2, dims, strides, box, "gemm X");
}

template <int kNT, Epilogue kEpi>
void launch(const GemmArgs& a, cudaStream_t stream) {
  using C = Cfg<kNT>;
  static int n_stages = 0, smem = 0;
  static std::once_flag configured;
  std::call_once(configured, [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    n_stages = std::min(kMaxStages, (optin - kSmemSlack) / C::kStage);
    MD_CHECK(n_stages >= 2, "gemm: shared memory too small for two stages of ", C::kStage, " bytes");
    smem = kSmemSlack + n_stages * C::kStage;
    CUDA_CHECK(
        cudaFuncSetAttribute(gemm_kernel<kNT, kEpi>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  });
  Shape s;
  s.n_rb = static_cast<int>(pack_row_blocks(a.n_rows));
  s.n_kb = static_cast<int>(pack_k_blocks(a.k));
  s.row_tiles = ceil_div(a.n_rows, kTileRows);
  s.splits = a.k_splits;
  s.columns = a.tiles != nullptr ? 0 : ceil_div(a.n_tokens, 8 * kNT);
  s.band = a.tiles != nullptr ? 1 : dense_band(a.k, C::kTokens);
  const int max_tiles = a.tiles != nullptr ? a.tile_capacity * s.row_tiles
                                           : dense_tiles(a.n_rows, a.n_tokens, kNT, a.k_splits);
  s.total = a.tiles != nullptr ? 0 : max_tiles;
  const int grid = std::min(max_tiles, sm_count());
  if (grid <= 0) return;
  const CUtensorMap x_map = x_tensor_map(a, a.tiles != nullptr ? a.x_rows : a.n_tokens, C::kTokens);
  // Packed weights as [expert][row block][k block][256 elements]: row blocks past the matrix and k
  // blocks past K read as zeros (128-token tiles only; the others copy row blocks in bulk).
  CUtensorMap w_map{};
  if constexpr (kWeightBox<kNT>) {
    const uint64_t w_dims[4] = {static_cast<uint64_t>(kPackRows * kPackK), static_cast<uint64_t>(s.n_kb),
                                static_cast<uint64_t>(s.n_rb), a.tiles != nullptr ? static_cast<uint64_t>(a.n_experts) : 1};
    const uint64_t w_strides[3] = {static_cast<uint64_t>(kPackTileBytes), static_cast<uint64_t>(s.n_kb) * kPackTileBytes,
                                   a.tiles != nullptr ? static_cast<uint64_t>(a.w_expert_stride) * 2
                                                      : static_cast<uint64_t>(s.n_rb) * s.n_kb * kPackTileBytes};
    const uint32_t w_box[4] = {static_cast<uint32_t>(kPackRows * kPackK), static_cast<uint32_t>(C::kKB),
                               static_cast<uint32_t>(kTileRowBlocks), 1};
    w_map = bf16_tensor_map_plain(a.w, 4, w_dims, w_strides, w_box, "gemm W");
  }
  gemm_kernel<kNT, kEpi><<<grid, kThreads, smem, stream>>>(a, w_map, x_map, s, n_stages);
  CUDA_CHECK_LAST();
}

template <Epilogue kEpi>
void launch_groups(const GemmArgs& a, int token_groups, cudaStream_t stream) {
  switch (token_groups) {
    case 1: return launch<1, kEpi>(a, stream);
    case 2: return launch<2, kEpi>(a, stream);
    case 4: return launch<4, kEpi>(a, stream);
    case 8: return launch<8, kEpi>(a, stream);
    default: return launch<16, kEpi>(a, stream);
  }
}

}  // namespace

size_t workspace_floats(int n_tokens, int n_rows, int token_groups, int k_splits) {
  return static_cast<size_t>(ceil_div(n_tokens, 8 * token_groups)) * ceil_div(n_rows, kTileRows) * k_splits *
         kTileRows * 8 * token_groups;
}
size_t semaphore_count(int n_tokens, int n_rows, int token_groups) {
  return static_cast<size_t>(ceil_div(n_tokens, 8 * token_groups)) * ceil_div(n_rows, kTileRows);
}

void gemm(const GemmArgs& in, Epilogue epilogue, cudaStream_t stream) {
  GemmArgs a = in;
  MD_REQUIRE(a.w != nullptr && a.x != nullptr && a.y != nullptr, "gemm: null operand");
  MD_REQUIRE(a.n_rows > 0 && a.k > 0 && a.k % 16 == 0, "gemm: shape [", a.n_rows, ", ", a.k,
             "] needs rows > 0 and k a positive multiple of 16");
  MD_REQUIRE(a.x_stride >= a.k && a.x_stride % 8 == 0, "gemm: x_stride ", a.x_stride,
             " must be >= k and a multiple of 8");
  MD_REQUIRE(reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0,
             "gemm: x and w must be 16-byte aligned");
  const int out_cols = epilogue == Epilogue::kSwiGlu ? a.n_rows / 2 : a.n_rows;
  MD_REQUIRE(a.y_stride >= out_cols, "gemm: y_stride ", a.y_stride, " < ", out_cols, " output columns");
  if (epilogue == Epilogue::kSwiGlu)
    MD_REQUIRE(a.n_rows % 16 == 0, "gemm: a fused gate/up matrix has a multiple of 16 rows, got ", a.n_rows);
  if (epilogue == Epilogue::kResidual)
    MD_REQUIRE(a.residual != nullptr && a.residual != a.y && a.residual_stride >= a.n_rows,
               "gemm: residual must be given, not alias y, and have stride >= rows");
  MD_REQUIRE(a.k_splits >= 1 && a.k_splits <= kMaxSplits && a.k_splits <= k_units(a.k), "gemm: k_splits ",
             a.k_splits, " outside 1..min(", kMaxSplits, ", k / 128)");
  if (a.tiles != nullptr) {
    MD_REQUIRE(a.n_tiles != nullptr && a.tile_capacity >= 1, "gemm: grouped mode needs n_tiles and a tile capacity >= 1");
    MD_REQUIRE(valid_token_groups(a.token_groups), "gemm: grouped mode needs the list's token_groups (1, 2, 4, 8 or 16), got ",
               a.token_groups);
    MD_REQUIRE(a.k_splits == 1, "gemm: grouped GEMMs do not split K");
    MD_REQUIRE(a.x_rows >= 1, "gemm: a grouped GEMM needs x_rows (the rows of X its tiles may read), got ", a.x_rows);
    MD_REQUIRE(a.n_experts >= 1 && a.w_expert_stride >= pack_row_blocks(a.n_rows) * pack_k_blocks(a.k) * kPackRows * kPackK,
               "gemm: a grouped GEMM needs n_experts >= 1 and an expert stride of at least one matrix, got ", a.n_experts,
               " and ", a.w_expert_stride);
  } else {
    MD_REQUIRE(a.n_tokens >= 0, "gemm: ", a.n_tokens, " tokens");
    if (a.n_tokens == 0) return;
    if (a.token_groups == 0) a.token_groups = dense_tile_groups(a.n_rows, a.n_tokens, a.k_splits, sm_count());
    MD_REQUIRE(valid_token_groups(a.token_groups), "gemm: token_groups ", a.token_groups, " is not one of 1, 2, 4, 8, 16");
  }
  if (a.k_splits > 1)
    MD_REQUIRE(epilogue != Epilogue::kSwiGlu && a.workspace != nullptr && a.semaphores != nullptr,
               "gemm: split K needs a workspace and semaphores, and no SwiGLU epilogue");
  switch (epilogue) {
    case Epilogue::kStore: return launch_groups<Epilogue::kStore>(a, a.token_groups, stream);
    case Epilogue::kResidual: return launch_groups<Epilogue::kResidual>(a, a.token_groups, stream);
    case Epilogue::kSwiGlu: return launch_groups<Epilogue::kSwiGlu>(a, a.token_groups, stream);
  }
}

void swiglu_mlp(const uint16_t* w_up, const uint16_t* w_down, int k, int inter, int n_out, const uint16_t* x,
                int x_stride, int n_tokens, uint16_t* mid, float* y, cudaStream_t stream) {
  auto dense = [n_tokens](const uint16_t* w, int n_rows, int kk, const uint16_t* in, int in_stride, void* out,
                          int out_stride) {
    GemmArgs g;
    g.w = w;
    g.n_rows = n_rows;
    g.k = kk;
    g.x = in;
    g.x_stride = in_stride;
    g.n_tokens = n_tokens;
    g.y = out;
    g.y_stride = out_stride;
    return g;
  };
  gemm(dense(w_up, 2 * inter, k, x, x_stride, mid, inter), Epilogue::kSwiGlu, stream);
  gemm(dense(w_down, n_out, inter, mid, inter, y, n_out), Epilogue::kStore, stream);
}

}  // namespace megadecode::cuda::gemm
