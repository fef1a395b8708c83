// row_logprobs (kernels.h): one CTA of 256 threads per row. Each thread scans its strided share of
// the row once: an online max and sum of exp (the log normaliser), whether a NaN is there, and its
// own kMaxTopLogprobs best (value, id) pairs, sorted in registers by an unrolled insertion (larger
// value first, ties to the lower id, NaN as -inf: engine/logits.h token_logprob's order). The
// threads' lists then merge in shared memory, one winner a round.
#include <cmath>

#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernels.h"

namespace megadecode::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTop = kMaxTopLogprobs;

// (v, id) before (w, jd): the larger value, ties to the lower id.
__device__ __forceinline__ bool better(float v, int id, float w, int jd) { return v > w || (v == w && id < jd); }

__global__ void __launch_bounds__(kThreads) row_logprobs_kernel(const float* logits, int stride, int vocab,
                                                                 const int32_t* tokens, RowLogprobs* out) {
  __shared__ float top_v[kTop][kThreads];
  __shared__ int top_id[kTop][kThreads];
  __shared__ float red_m[kThreads / 32], red_s[kThreads / 32];
  __shared__ float win_v[kThreads / 32];
  __shared__ int win_id[kThreads / 32], win_t[kThreads / 32];
  __shared__ int any_nan;
  const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* l = logits + static_cast<int64_t>(row) * stride;
  const float kNegInf = -INFINITY;
  if (tid == 0) any_nan = 0;
  float v[kTop];
  int id[kTop];
#pragma unroll
  for (int j = 0; j < kTop; ++j) v[j] = kNegInf, id[j] = INT_MAX;
  float m = kNegInf, s = 0.0f;
  bool nan = false;
  __syncthreads();
  for (int i = tid; i < vocab; i += kThreads) {
    const float x = l[i];
    nan |= x != x;
    float cv = x != x ? kNegInf : x;  // NaN ranks as -inf and adds nothing to the normaliser
    int ci = i;
    if (cv > m) {
      s = (m == kNegInf ? 0.0f : s * expf(m - cv)) + 1.0f;
      m = cv;
    } else if (cv != kNegInf) {
      s += expf(cv - m);
    }
    if (better(cv, ci, v[kTop - 1], id[kTop - 1])) {
#pragma unroll
      for (int j = 0; j < kTop; ++j)
        if (better(cv, ci, v[j], id[j])) {
          const float tv = v[j];
          const int ti = id[j];
          v[j] = cv, id[j] = ci;
          cv = tv, ci = ti;
        }
    }
  }
  if (nan) any_nan = 1;
#pragma unroll
  for (int j = 0; j < kTop; ++j) top_v[j][tid] = v[j], top_id[j][tid] = id[j];
  // The normaliser: (m, s) pairs merged by warp, then across warps.
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(~0u, m, o), s2 = __shfl_xor_sync(~0u, s, o);
    const float mm = fmaxf(m, m2);
    s = (m == kNegInf ? 0.0f : s * expf(m - mm)) + (m2 == kNegInf ? 0.0f : s2 * expf(m2 - mm));
    m = mm;
  }
  if (lane == 0) red_m[warp] = m, red_s[warp] = s;
  __syncthreads();
  float M = kNegInf;
  double S = 0.0;
  for (int w = 0; w < kThreads / 32; ++w) M = fmaxf(M, red_m[w]);
  for (int w = 0; w < kThreads / 32; ++w)
    if (red_m[w] != kNegInf) S += static_cast<double>(red_s[w]) * exp(static_cast<double>(red_m[w]) - M);
  const bool row_nan = any_nan != 0;
  const double log_z = isfinite(M) ? M + log(S) : 0.0;
  auto logprob_of = [&](float x) -> float {  // token_logprob's rules
    if (row_nan) return NAN;
    if (!isfinite(M) || x == kNegInf) return kNegInf;
    return static_cast<float>(x - log_z);
  };
  // The merge: kTop rounds; each thread offers its list's head, the best offer wins and its thread
  // moves past it.
  int head = 0;
  RowLogprobs& o = out[row];
  for (int k = 0; k < kTop; ++k) {
    float hv = head < kTop ? top_v[head][tid] : kNegInf;
    int hid = head < kTop ? top_id[head][tid] : INT_MAX;
    int ht = tid;
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(~0u, hv, off);
      const int oid = __shfl_xor_sync(~0u, hid, off), ot = __shfl_xor_sync(~0u, ht, off);
      if (better(ov, oid, hv, hid)) hv = ov, hid = oid, ht = ot;
    }
    if (lane == 0) win_v[warp] = hv, win_id[warp] = hid, win_t[warp] = ht;
    __syncthreads();
    float bv = win_v[0];
    int bid = win_id[0], bt = win_t[0];
    for (int w = 1; w < kThreads / 32; ++w)
      if (better(win_v[w], win_id[w], bv, bid)) bv = win_v[w], bid = win_id[w], bt = win_t[w];
    if (tid == bt) ++head;
    if (tid == 0) {
      o.ids[k] = bid < vocab ? bid : -1;
      o.logprobs[k] = bid < vocab ? logprob_of(l[bid]) : kNegInf;
    }
    __syncthreads();
  }
  if (tid == 0) {
    const int32_t t = tokens[row];
    o.token = t;
    o.logprob = t >= 0 && t < vocab ? logprob_of(l[t]) : kNegInf;
  }
}

}  // namespace

void row_logprobs(const float* logits, int logits_stride, int n_rows, int vocab, const int32_t* tokens,
                  RowLogprobs* out, cudaStream_t stream) {
  MD_REQUIRE(vocab >= 1 && logits_stride >= vocab && n_rows >= 0, "row_logprobs: vocab ", vocab, ", stride ",
             logits_stride, ", rows ", n_rows);
  if (n_rows == 0) return;
  row_logprobs_kernel<<<n_rows, kThreads, 0, stream>>>(logits, logits_stride, vocab, tokens, out);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda
