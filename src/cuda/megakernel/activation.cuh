// The consumers' activation fills: the GEMM prologues that put a job's activation window into shared
// memory (bf16 rows, pitch = window + kActPad elements, 16-byte vector loads and stores).
//   RMSNorm fill (QKV, router, expert up, LM head): each row's scale r = 1 / sqrt(mean(v^2) + eps)
//   from the whole fp32 residual row (one warp per row, 16 loads per lane in flight: the fill is on
//   the layer's critical path), then bf16(bf16(v * r) * weight) — the HF rounding points. Every SM computes the same scale with the same code and summation order,
//   so the norm needs no task of its own. Layer 0's residual is
//   the embedding row of the token (bf16, exact in fp32).
//   Row copy (O-proj: the merged attention output; expert down: the up outputs of its slots).
// Rows other SMs wrote in this launch are read with coherent loads after the task's acquire (never the
// non-coherent path): ld.global.cg, or .ca where the fill reads them twice (the RMSNorm rows).
#pragma once

#include <cstdint>

#include "cuda/common/warp.cuh"
#include "cuda/megakernel/sync.cuh"

namespace megadecode::cuda::mk {

// Where an RMSNorm fill reads row r: an fp32 residual, or (x == nullptr) the embedding of tokens[r].
struct NormSource {
  const float* x;          // [rows][H] fp32
  const uint16_t* embed;   // [vocab][H] bf16 (x == nullptr)
  const int32_t* tokens;   // [rows]
  const uint16_t* weight;  // [H] bf16 norm weight
  int32_t H;
  float eps;
};

// Four elements [i, i + 4) of row r of the source (kEmbed: the token's embedding row, bf16).
template <bool kEmbed>
__device__ __forceinline__ float4 norm_load4(const NormSource& src, int r, int i) {
  if constexpr (!kEmbed) {
    // Cached in L1 (ld.global.ca): the scale pass misses (the task's acquire emptied L1) and the
    // normalising pass then reads the same bytes from L1, not a second L2 round trip. The cache
    // operator is only a hint: the acquire before the task orders these weak loads as it does .cg.
    return __ldca(reinterpret_cast<const float4*>(src.x + static_cast<int64_t>(r) * src.H + i));
  } else {
    const uint2 b = __ldg(reinterpret_cast<const uint2*>(src.embed + static_cast<int64_t>(src.tokens[r]) * src.H + i));
    return make_float4(bf16_bits_to_float(static_cast<uint16_t>(b.x)), bf16_bits_to_float(static_cast<uint16_t>(b.x >> 16)),
                       bf16_bits_to_float(static_cast<uint16_t>(b.y)), bf16_bits_to_float(static_cast<uint16_t>(b.y >> 16)));
  }
}

constexpr int kNormChunk = 16;  // float4 loads per lane in flight

// part[r] = sum of squares of row r for rows [0, n_rows): warp w takes rows w, w + 8, ..., lane l
// sums elements 4l + 128j (j ascending, kNormChunk loads in flight), then a butterfly. The order
// depends on nothing but the row (not the batch, the warp or the SM), so every tile of every SM
// computes the same bits.
template <bool kEmbed>
__device__ inline void norm_sums(const NormSource& src, int n_rows, float* part) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nj = src.H / 128;
#pragma unroll 1
  for (int r = warp; r < n_rows; r += kConsumerWarps) {
    float ss = 0.0f;
#pragma unroll 1
    for (int j0 = 0; j0 < nj; j0 += kNormChunk) {
      float4 v[kNormChunk];
#pragma unroll
      for (int u = 0; u < kNormChunk; ++u)
        v[u] = j0 + u < nj ? norm_load4<kEmbed>(src, r, 4 * lane + 128 * (j0 + u)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int u = 0; u < kNormChunk; ++u) {
        ss += v[u].x * v[u].x;
        ss += v[u].y * v[u].y;
        ss += v[u].z * v[u].z;
        ss += v[u].w * v[u].w;
      }
    }
    ss = warp_sum(ss);
    if (lane == 0) part[r] = ss;
  }
}

// scale[r] = 1 / sqrt(mean(v^2) + eps) for rows [0, n_rows) (norm_sums' order). `part`: n_rows
// floats of scratch. All consumer threads call it; the caller meets after.
template <bool kEmbed>
__device__ inline void norm_scales(const NormSource& src, int n_rows, float* part, float* scale) {
  norm_sums<kEmbed>(src, n_rows, part);
  consumer_sync();
  for (int r = threadIdx.x; r < n_rows; r += kConsumerThreads)
    scale[r] = 1.0f / sqrtf(part[r] / static_cast<float>(src.H) + src.eps);
}

// bf16(bf16(a * s) * w_a) | bf16(bf16(b * s) * w_b) << 16 (w2: the two bf16 weights, packed).
__device__ __forceinline__ uint32_t normed_pair(float a, float b, float s, uint32_t w2) {
  const uint32_t n = ptx::pack_bf16x2(a * s, b * s);
  return ptx::pack_bf16x2(__uint_as_float(n << 16) * __uint_as_float(w2 << 16),
                     __uint_as_float(n & 0xffff0000u) * __uint_as_float(w2 & 0xffff0000u));
}

// w_own: when a row has exactly one 8-column chunk per consumer thread (kw = 8 * 256: hidden 2048),
// every row's chunk of this thread has the same columns, so its caller loaded their weights
// beforehand (own_w) and the loop issues only the row's loads.
template <bool kEmbed>
__device__ inline void fill_normed_rows(const NormSource& src, const float* scale, int n_rows, int k0, int kw,
                                        uint16_t* dst, int pitch, bool own_w, uint4 w_own) {
  const int per_row = kw / 8;
#pragma unroll 2
  for (int idx = threadIdx.x; idx < n_rows * per_row; idx += kConsumerThreads) {
    const int r = idx / per_row, c = idx % per_row, k = k0 + c * 8;
    const float4 a = norm_load4<kEmbed>(src, r, k), b = norm_load4<kEmbed>(src, r, k + 4);
    const uint4 w = own_w ? w_own : __ldg(reinterpret_cast<const uint4*>(src.weight + k));
    const float s = scale[r];
    uint4 out;
    out.x = normed_pair(a.x, a.y, s, w.x);
    out.y = normed_pair(a.z, a.w, s, w.y);
    out.z = normed_pair(b.x, b.y, s, w.z);
    out.w = normed_pair(b.z, b.w, s, w.w);
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(r) * pitch + c * 8) = out;
  }
}


// Rows [row0, row0 + n_rows) of a bf16 matrix (stride elements per row), columns [k0, k0 + kw),
// into dst rows 0.. . kw a multiple of 8. All consumer threads; the caller meets before and after.
__device__ inline void fill_rows(const uint16_t* src, int64_t stride, int row0, int n_rows, int k0, int kw, uint16_t* dst,
                                 int pitch) {
  const int per_row = kw / 8;
#pragma unroll 4
  for (int idx = threadIdx.x; idx < n_rows * per_row; idx += kConsumerThreads) {
    const int r = idx / per_row, c = idx % per_row;
    const uint4 v = __ldcg(reinterpret_cast<const uint4*>(src + static_cast<int64_t>(row0 + r) * stride + k0 + c * 8));
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(r) * pitch + c * 8) = v;
  }
}

// A GEMM job's activation fill as data (one noinline routine for every op).
enum class FillKind : int32_t {
  kNormed,  // RMSNorm rows of ns (QKV, router, expert up, LM head)
  kRows,    // a bf16 row copy of src (O-proj: the attention output; expert down: the up outputs)
};
struct Fill {
  FillKind kind;
  int32_t window_kb;    // k blocks per window (the job's layout)
  int32_t n_kb;         // k blocks in all
  int32_t filled;       // the window the area holds now (-1: none): asking for it again is free
  int32_t scales_ready; // kNormed: scale[] holds the rows' scales (else window 0 computes them)
  uint16_t* dst;        // row r of the window at dst + r * pitch
  int32_t pitch;
  NormSource ns;        // kNormed
  float* scale;         // kNormed: [n_rows]
  float* part;          // kNormed: [n_rows] scratch of norm_scales
  const uint16_t* src;  // kRows: a bf16 matrix of `stride` elements per row
  int64_t stride;
};

// Columns [k0, k0 + kw) of rows [0, n_rows) of an RMSNorm fill (f = *fp), their scales first when
// *fp has none yet. All consumer threads; the caller meets before and after.
template <bool kEmbed>
__device__ __forceinline__ void fill_normed_window(const Fill& f, Fill* fp, int n_rows, int k0, int kw) {
  // This thread's weight chunk, issued before the scale pass so that its L2 round trip overlaps the
  // rows' (fill_normed_rows: own_w).
  const bool own_w = kw / 8 == kConsumerThreads;
  const uint4 w_own = own_w ? __ldg(reinterpret_cast<const uint4*>(f.ns.weight + k0 + 8 * threadIdx.x))
                            : make_uint4(0u, 0u, 0u, 0u);
  if (!f.scales_ready) {
    norm_scales<kEmbed>(f.ns, n_rows, f.part, f.scale);
    consumer_sync();
    if (threadIdx.x == 0) fp->scales_ready = 1;
  }
  fill_normed_rows<kEmbed>(f.ns, f.scale, n_rows, k0, kw, f.dst, f.pitch, own_w, w_own);
}

// Layer 0's RMSNorm fill, from the tokens' embedding rows: out of line (one layer of the step), so
// that fill_window's own code, which every GEMM task runs, holds only the fp32-residual path.
__device__ __noinline__ void fill_window_embed(Fill* fp, int n_rows, int k0, int kw) {
  const Fill f = *fp;
  fill_normed_window<true>(f, fp, n_rows, k0, kw);
}

// Window w of the fill described by *fp (shared memory, written by consumer thread 0 before a
// consumer barrier): activation rows [row0, row0 + n_rows) of the source (kNormed: row0 = 0) into
// rows 0.. of the area. All consumer threads; the caller meets before and after, and has read
// fp->filled before its first barrier (this routine's thread 0 updates it). Out of line: one copy
// for its callers (it runs once a window, not a page); it takes the description by pointer so
// nothing of it goes through the stack.
__device__ __noinline__ void fill_window(Fill* fp, int w, int row0, int n_rows) {
  const Fill f = *fp;
  const int k0 = w * f.window_kb * 16, kw = min(f.n_kb - w * f.window_kb, f.window_kb) * 16;
  if (f.kind == FillKind::kRows) {
    fill_rows(f.src, f.stride, row0, n_rows, k0, kw, f.dst, f.pitch);
  } else if (f.ns.x == nullptr) {
    fill_window_embed(fp, n_rows, k0, kw);
  } else {
    fill_normed_window<false>(f, fp, n_rows, k0, kw);
  }
  if (threadIdx.x == 0) fp->filled = w;
}

}  // namespace megadecode::cuda::mk
