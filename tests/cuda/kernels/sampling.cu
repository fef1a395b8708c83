// Standalone sampling: four small launches per step (see cuda/common/sampling.cuh for the method).
//   1. per (vocab chunk, row): max logit and argmax                  [many CTAs per row]
//   2. per row (1024 threads): row max; greedy rows done; otherwise the kept-set threshold by
//      radix select (only when min-p, top-k or top-p is active)
//   3. per (vocab chunk, row): Gumbel-max over the kept tokens         [many CTAs per row]
//   4. per row: the winning token
#include <algorithm>

#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/sampling.cuh"
#include "kernels.h"

namespace megadecode::cuda {
namespace {

constexpr float kGreedyTemperature = 1e-5f;  // as the host sampler
constexpr int kSelectThreads = 1024;

struct Partial {
  float value;
  int index;
};

struct Workspace {
  Partial* max_part;     // [rows][chunks]
  Partial* draw_part;    // [rows][chunks]
  float* row_max;        // [rows]
  uint64_t* threshold;   // [rows]
};

Workspace carve(void* ws, int n_rows, int n_chunks) {
  auto* p = static_cast<uint8_t*>(ws);
  Workspace w;
  w.max_part = reinterpret_cast<Partial*>(p);
  p += size_t(n_rows) * n_chunks * sizeof(Partial);
  w.draw_part = reinterpret_cast<Partial*>(p);
  p += size_t(n_rows) * n_chunks * sizeof(Partial);
  w.threshold = reinterpret_cast<uint64_t*>(p);
  p += size_t(n_rows) * sizeof(uint64_t);
  w.row_max = reinterpret_cast<float*>(p);
  return w;
}

// Block-wide (value, index) argmax; every thread gets the result. scratch: 64 words.
__device__ void block_argmax(float& v, int& i, float* sv, int* si) {
  for (int o = 16; o > 0; o >>= 1) argmax_merge(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
  const int warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  v = sv[0];
  i = si[0];
  for (int w = 1; w < n_warps; ++w) argmax_merge(v, i, sv[w], si[w]);
}

__global__ void max_kernel(const float* logits, int stride, int vocab, Partial* part, int n_chunks) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const int row = blockIdx.y, chunk = blockIdx.x;
  const float* l = logits + int64_t(row) * stride;
  float v = -INFINITY;
  int idx = 0x7fffffff;
  const int end = min(vocab, (chunk + 1) * kSampleChunk);
  for (int i = chunk * kSampleChunk + threadIdx.x; i < end; i += blockDim.x) argmax_merge(v, idx, l[i], i);
  block_argmax(v, idx, sv, si);
  if (threadIdx.x == 0) part[int64_t(row) * n_chunks + chunk] = Partial{v, idx};
}

// Block-wide exclusive prefix sum of two values per thread (2 * blockDim.x items, item order
// 2*tid, 2*tid+1). Integer: exact. scratch: 32 words.
__device__ void block_exclusive_scan2(uint64_t a, uint64_t b, uint64_t& ea, uint64_t& eb, uint64_t* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  uint64_t incl = a + b;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t up = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += up;
  }
  __syncthreads();
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  uint64_t warp_off = 0;
  for (int w = 0; w < warp; ++w) warp_off += scratch[w];
  (void)n_warps;
  ea = warp_off + incl - (a + b);
  eb = ea + a;
}

// The key kappa with measure(keys > kappa) < target <= measure(keys >= kappa) among keys >= lower,
// where the measure is the count (use_mass false) or the fixed-point mass. Whole CTA.
__device__ uint64_t radix_select(const float* l, int vocab, float mx, float inv_t, uint64_t lower, uint64_t target,
                                 bool use_mass, uint64_t* hist, uint64_t* scratch, uint64_t* shared_result) {
  uint64_t prefix = 0, above = 0;
  for (int pass = 0; pass < kSamplePasses; ++pass) {
    const int shift = (kSamplePasses - 1 - pass) * kSampleDigitBits;
    for (int b = threadIdx.x; b < kSampleBins; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      const uint64_t key = sample_key(l[i], i);
      if (key < lower) continue;
      if (pass > 0 && (key >> (shift + kSampleDigitBits)) != prefix) continue;
      const int d = int((key >> shift) & (kSampleBins - 1));
      atomicAdd(reinterpret_cast<unsigned long long*>(&hist[d]),
                static_cast<unsigned long long>(use_mass ? sample_mass(l[i], mx, inv_t) : 1ull));
    }
    __syncthreads();
    // Items in descending digit order: item r is digit kSampleBins - 1 - r.
    const int r0 = 2 * threadIdx.x;
    const uint64_t m0 = hist[kSampleBins - 1 - r0], m1 = hist[kSampleBins - 2 - r0];
    uint64_t e0, e1;
    block_exclusive_scan2(m0, m1, e0, e1, scratch);
    if (above + e0 < target && target <= above + e0 + m0) {
      shared_result[0] = uint64_t(kSampleBins - 1 - r0);
      shared_result[1] = above + e0;
    }
    if (above + e1 < target && target <= above + e1 + m1) {
      shared_result[0] = uint64_t(kSampleBins - 2 - r0);
      shared_result[1] = above + e1;
    }
    __syncthreads();
    prefix = (prefix << kSampleDigitBits) | shared_result[0];
    above = shared_result[1];
    __syncthreads();
  }
  return prefix;
}

__global__ void __launch_bounds__(kSelectThreads) select_kernel(const float* logits, int stride, int vocab,
                                                                 const DeviceSamplingParams* params, int n_chunks,
                                                                 Workspace w, int32_t* tokens) {
  __shared__ uint64_t hist[kSampleBins];
  __shared__ uint64_t scratch[32];
  __shared__ uint64_t result[2];
  __shared__ float sv[32];
  __shared__ int si[32];
  const int row = blockIdx.x;
  float v = -INFINITY;
  int idx = 0x7fffffff;
  for (int c = threadIdx.x; c < n_chunks; c += blockDim.x) {
    const Partial p = w.max_part[int64_t(row) * n_chunks + c];
    argmax_merge(v, idx, p.value, p.index);
  }
  block_argmax(v, idx, sv, si);
  const DeviceSamplingParams sp = params[row];
  if (sp.temperature < kGreedyTemperature || !(v > -INFINITY)) {
    if (threadIdx.x == 0) {
      tokens[row] = idx < vocab ? idx : 0;
      w.threshold[row] = ~0ull;  // marks the row done for the draw passes
    }
    return;
  }
  const float* l = logits + int64_t(row) * stride;
  const float inv_t = 1.0f / sp.temperature;
  uint64_t n_kept = uint64_t(vocab);
  if (sp.min_p > 0.0f) {
    uint64_t c = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) c += expf((l[i] - v) * inv_t) >= sp.min_p ? 1 : 0;
    uint64_t e0, e1;
    block_exclusive_scan2(c, 0, e0, e1, scratch);  // e1 = inclusive count of this thread
    if (threadIdx.x == blockDim.x - 1) result[0] = e1;
    __syncthreads();
    n_kept = result[0];
    __syncthreads();
  }
  if (sp.top_k > 0) n_kept = std::min<uint64_t>(n_kept, uint64_t(sp.top_k));
  n_kept = std::max<uint64_t>(n_kept, 1);
  uint64_t kappa = n_kept >= uint64_t(vocab) ? 0 : radix_select(l, vocab, v, inv_t, 0, n_kept, false, hist, scratch, result);
  if (sp.top_p < 1.0f) {
    uint64_t m = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
      if (sample_key(l[i], i) >= kappa) m += sample_mass(l[i], v, inv_t);
    uint64_t e0, e1;
    block_exclusive_scan2(m, 0, e0, e1, scratch);
    if (threadIdx.x == blockDim.x - 1) result[0] = e1;
    __syncthreads();
    const uint64_t total = result[0];
    __syncthreads();
    // Kept while the mass before a token is < top_p * total; target = the first mass that stops.
    uint64_t target = static_cast<uint64_t>(ceil(static_cast<double>(sp.top_p) * static_cast<double>(total)));
    target = std::max<uint64_t>(target, 1);
    if (target <= total) kappa = radix_select(l, vocab, v, inv_t, kappa, target, true, hist, scratch, result);
  }
  if (threadIdx.x == 0) {
    w.threshold[row] = kappa;
    w.row_max[row] = v;
  }
}

__global__ void draw_kernel(const float* logits, int stride, int vocab, const DeviceSamplingParams* params,
                            Workspace w, int n_chunks) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const int row = blockIdx.y, chunk = blockIdx.x;
  const uint64_t kappa = w.threshold[row];
  if (kappa == ~0ull) return;  // greedy row, already decided
  const DeviceSamplingParams sp = params[row];
  const float inv_t = 1.0f / sp.temperature;
  const float* l = logits + int64_t(row) * stride;
  float best = -INFINITY;
  int idx = 0x7fffffff;
  const int end = min(vocab, (chunk + 1) * kSampleChunk);
  for (int i = chunk * kSampleChunk + threadIdx.x; i < end; i += blockDim.x) {
    if (sample_key(l[i], i) < kappa) continue;
    argmax_merge(best, idx, l[i] * inv_t + sample_gumbel(sp.seed, sp.position, i), i);
  }
  block_argmax(best, idx, sv, si);
  if (threadIdx.x == 0) w.draw_part[int64_t(row) * n_chunks + chunk] = Partial{best, idx};
}

__global__ void final_kernel(Workspace w, int n_chunks, int32_t* tokens) {
  const int row = blockIdx.x;
  if (w.threshold[row] == ~0ull) return;
  float v = -INFINITY;
  int idx = 0x7fffffff;
  for (int c = threadIdx.x; c < n_chunks; c += 32) {
    const Partial p = w.draw_part[int64_t(row) * n_chunks + c];
    argmax_merge(v, idx, p.value, p.index);
  }
  for (int o = 16; o > 0; o >>= 1) argmax_merge(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
  if (threadIdx.x == 0) tokens[row] = idx;
}

int n_chunks_for(int vocab) { return (vocab + kSampleChunk - 1) / kSampleChunk; }

}  // namespace

size_t sampling_workspace_bytes(int n_rows, int vocab) {
  return 2 * size_t(n_rows) * n_chunks_for(vocab) * sizeof(Partial) + size_t(n_rows) * (sizeof(uint64_t) + sizeof(float));
}

void sample_tokens(const float* logits, int logits_stride, int n_rows, int vocab, const DeviceSamplingParams* params,
                   int32_t* tokens, void* workspace, cudaStream_t stream) {
  MD_REQUIRE(vocab >= 1 && vocab < (1 << kSampleKeyIdxBits), "sample_tokens: vocab ", vocab, " outside 1..2^23-1");
  MD_REQUIRE(logits_stride >= vocab, "sample_tokens: logits_stride < vocab");
  MD_REQUIRE(n_rows >= 0 && n_rows <= 65535, "sample_tokens: n_rows ", n_rows);
  MD_REQUIRE(workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 16 == 0,
             "sample_tokens: workspace must be 16-byte aligned (sampling_workspace_bytes)");
  if (n_rows == 0) return;
  const int n_chunks = n_chunks_for(vocab);
  const Workspace w = carve(workspace, n_rows, n_chunks);
  max_kernel<<<dim3(n_chunks, n_rows), 256, 0, stream>>>(logits, logits_stride, vocab, w.max_part, n_chunks);
  CUDA_CHECK_LAST();
  select_kernel<<<n_rows, kSelectThreads, 0, stream>>>(logits, logits_stride, vocab, params, n_chunks, w, tokens);
  CUDA_CHECK_LAST();
  draw_kernel<<<dim3(n_chunks, n_rows), 256, 0, stream>>>(logits, logits_stride, vocab, params, w, n_chunks);
  CUDA_CHECK_LAST();
  final_kernel<<<n_rows, 32, 0, stream>>>(w, n_chunks, tokens);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda
