// A sliding layer's K/V between the sequence's ring and the prefill scratch (prefill_kernels.h
// ring_copy): one thread a 16-byte piece of a (position, KV head) row, K and V alike.
#include <algorithm>

#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/prefill/prefill_kernels.h"

namespace megadecode::cuda::prefill {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) ring_copy_kernel(const RingCopyArgs a) {
  const int chunks = a.head_dim / 8, G = a.n_kv_heads, B = a.block_size;
  const int64_t total = static_cast<int64_t>(a.end - a.begin) * G * chunks;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int ch = static_cast<int>(i % chunks), g = static_cast<int>((i / chunks) % G);
    const int pos = a.begin + static_cast<int>(i / (int64_t{chunks} * G)), j = pos - a.base;
    const int64_t ring = kv_offset(a.ring_table[(pos / B) % a.ring_len], g, pos % B, ch * 8, G, B, a.head_dim);
    const int64_t scratch = kv_offset(j / B, g, j % B, ch * 8, G, B, a.head_dim);
    if (a.to_ring) {
      *reinterpret_cast<uint4*>(a.ring_k + ring) = *reinterpret_cast<const uint4*>(a.scratch_k + scratch);
      *reinterpret_cast<uint4*>(a.ring_v + ring) = *reinterpret_cast<const uint4*>(a.scratch_v + scratch);
    } else {
      *reinterpret_cast<uint4*>(a.scratch_k + scratch) = *reinterpret_cast<const uint4*>(a.ring_k + ring);
      *reinterpret_cast<uint4*>(a.scratch_v + scratch) = *reinterpret_cast<const uint4*>(a.ring_v + ring);
    }
  }
}

}  // namespace

void ring_copy(const RingCopyArgs& a, cudaStream_t stream) {
  MD_REQUIRE(a.ring_k && a.ring_v && a.ring_table && a.scratch_k && a.scratch_v, "ring copy: null pointer");
  MD_REQUIRE(a.ring_len >= 1 && a.block_size >= 1 && a.n_kv_heads >= 1 && a.head_dim % 8 == 0,
             "ring copy: bad ring length, block size, KV heads or head dim");
  MD_REQUIRE(a.base >= 0 && a.begin >= a.base && a.end >= a.begin, "ring copy: positions [", a.begin, ", ", a.end,
             ") before the scratch's first position ", a.base);
  if (a.end == a.begin) return;
  const int64_t total = static_cast<int64_t>(a.end - a.begin) * a.n_kv_heads * (a.head_dim / 8);
  const int grid = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 4096));
  ring_copy_kernel<<<grid, kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda::prefill
