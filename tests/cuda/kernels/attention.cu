// Standalone kernels: paged decode attention (grid = splits x kv heads x sequences) and the
// log-sum-exp merge of the splits (grid = heads x sequences).
#include "attention.cuh"
#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "kernels.h"

namespace megadecode::cuda {
namespace {

template <int kD>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(const AttentionArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int split = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z;
  const int group = a.n_heads / a.n_kv_heads;
  AttnItem it;
  it.q = a.q + (int64_t(seq) * a.n_heads + kvh * group) * kD;
  it.group = group;
  it.k_cache = a.k_cache;
  it.v_cache = a.v_cache;
  it.block_table = a.block_table + int64_t(seq) * a.max_blocks;
  it.kv_head = kvh;
  it.n_kv_heads = a.n_kv_heads;
  it.block_size = a.block_size;
  attention_split_range(a.context_lens[seq], a.n_splits, split, &it.t_begin, &it.t_end);
  it.scale_log2 = a.scale * 1.4426950408889634f;
  const int64_t row0 = (int64_t(seq) * a.n_heads + kvh * group) * a.n_splits + split;
  it.o = a.o_part + row0 * kD;
  it.o_row_stride = int64_t(a.n_splits) * kD;
  it.ml = a.ml_part + row0 * 2;
  it.ml_row_stride = int64_t(a.n_splits) * 2;
  attention_item<kD>(it, smem);
}

template <int kD>
__global__ void merge_kernel(const float* o_part, const float* ml_part, uint16_t* out, int n_heads, int n_splits) {
  const int64_t row = int64_t(blockIdx.y) * n_heads + blockIdx.x;  // (seq, head)
  attention_merge_head<kD>(o_part + row * n_splits * kD, ml_part + row * n_splits * 2, n_splits, out + row * kD);
}

template <int kD>
void launch_attention(const AttentionArgs& a, cudaStream_t stream) {
  constexpr int smem = AttnSmem<kD>::kBytes;
  static bool configured = false;
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  attention_kernel<kD><<<dim3(a.n_splits, a.n_kv_heads, a.n_seqs), kAttnThreads, smem, stream>>>(a);
  CUDA_CHECK_LAST();
}

}  // namespace

void attention_decode(const AttentionArgs& a, cudaStream_t stream) {
  MD_REQUIRE(a.head_dim == 32 || a.head_dim == 64 || a.head_dim == 128, "attention_decode: head_dim ", a.head_dim,
             " not 32, 64 or 128");
  MD_REQUIRE(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "attention_decode: n_heads ", a.n_heads,
             " not a multiple of n_kv_heads ", a.n_kv_heads);
  MD_REQUIRE(a.n_heads / a.n_kv_heads <= kAttnMaxGroup, "attention_decode: GQA group larger than ", kAttnMaxGroup);
  MD_REQUIRE(a.n_splits >= 1 && a.n_splits <= 65535, "attention_decode: n_splits ", a.n_splits);
  MD_REQUIRE(a.block_size > 0 && a.max_blocks > 0, "attention_decode: bad block_size/max_blocks");
  MD_REQUIRE(a.n_seqs >= 0 && a.n_seqs <= 65535, "attention_decode: n_seqs ", a.n_seqs);
  if (a.n_seqs == 0) return;
  switch (a.head_dim) {
    case 32: return launch_attention<32>(a, stream);
    case 64: return launch_attention<64>(a, stream);
    default: return launch_attention<128>(a, stream);
  }
}

void attention_merge(const float* o_part, const float* ml_part, uint16_t* out, int n_seqs, int n_heads, int n_splits,
                     int head_dim, cudaStream_t stream) {
  MD_REQUIRE(head_dim == 32 || head_dim == 64 || head_dim == 128, "attention_merge: head_dim ", head_dim);
  MD_REQUIRE(n_splits >= 1 && n_heads >= 1 && n_seqs >= 0 && n_seqs <= 65535, "attention_merge: bad sizes");
  if (n_seqs == 0) return;
  const dim3 grid(n_heads, n_seqs);
  switch (head_dim) {
    case 32: merge_kernel<32><<<grid, 32, 0, stream>>>(o_part, ml_part, out, n_heads, n_splits); break;
    case 64: merge_kernel<64><<<grid, 64, 0, stream>>>(o_part, ml_part, out, n_heads, n_splits); break;
    default: merge_kernel<128><<<grid, 128, 0, stream>>>(o_part, ml_part, out, n_heads, n_splits); break;
  }
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda
