// CudaBackend's KV pools (see cuda_backend.h): sized from the memory the weights and workspaces
// leave (engine/kv_pools.h), allocated and zeroed once at start-up.
#include <algorithm>

#include "core/check.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cuda_check.h"
#include "engine/kv_pools.h"
#include "kv/kv_cache.h"

namespace megadecode::cuda {
namespace {

constexpr size_t kActivationReserve = size_t(512) << 20;  // arena, plan and staging headroom

}  // namespace

void CudaBackend::allocate_kv() {
  const ModelConfig& c = config();
  // Sliding-window layers keep their K/V in a ring pool (cpu-ref's layout: kv/kv_cache.h), the
  // full-attention layers in the full pool; each pool has a slice for its own layers only
  // (MkLayerWeights::kv_full_index, kv_ring_index). engine/kv_pools.h sizes them: the ring pool gets
  // min(full blocks, max_decode_batch() rings) unless --n-ring-blocks says otherwise.
  const KvPoolShape pools = kv_pool_shape(c, options_.kv_block_size, 2);
  n_full_layers_ = pools.n_full_layers;
  n_ring_layers_ = pools.n_ring_layers;
  ring_len_ = pools.ring_length;
  MD_REQUIRE(n_full_layers_ > 0, "model_type ", c.model_type, " has no full-attention layer (every layer has a sliding "
             "window): the CUDA backends need at least one; use backend cpu-ref");
  double budget = 0.0;
  if (options_.n_kv_blocks == 0) {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    budget = options_.gpu_memory_utilization * static_cast<double>(total_b) - static_cast<double>(total_b - free_b) -
             static_cast<double>(kActivationReserve);
    // The smallest useful pool: a full block for each sequence of the largest batch, and a ring
    // block for each (at least one whole ring).
    const double minimal = static_cast<double>(pools.full_block_bytes) * max_decode_batch() +
                           static_cast<double>(pools.ring_block_bytes) *
                               (options_.n_ring_blocks > 0 ? options_.n_ring_blocks
                                                           : std::max(max_decode_batch(), pools.ring_length));
    MD_REQUIRE(budget >= minimal, "the KV cache does not fit: the model and workspaces leave ",
               static_cast<int64_t>(std::max(budget, 0.0)) >> 20, " MiB of the ",
               static_cast<int64_t>(options_.gpu_memory_utilization * static_cast<double>(total_b)) >> 20,
               " MiB --gpu-memory-utilization ", options_.gpu_memory_utilization, " allows (", free_b >> 20,
               " MiB free of ", total_b >> 20, "); a minimal pool (one block per sequence of ", max_decode_batch(),
               ") needs ", static_cast<int64_t>(minimal) >> 20, " MiB: raise --gpu-memory-utilization or lower "
               "--max-num-seqs or --block-size");
  }
  const KvPoolSizes sizes =
      size_kv_pools(pools, budget, max_decode_batch(), options_.n_kv_blocks, options_.n_ring_blocks);
  n_kv_blocks_ = static_cast<int>(sizes.n_blocks);
  MD_REQUIRE(n_kv_blocks_ >= 1, "the KV cache has no block");
  CUDA_CHECK(cudaMalloc(&kv_, static_cast<size_t>(pools.full_block_bytes) * n_kv_blocks_));
  CUDA_CHECK(cudaMemset(kv_, 0, static_cast<size_t>(pools.full_block_bytes) * n_kv_blocks_));
  if (n_ring_layers_ > 0) {
    n_ring_blocks_ = static_cast<int>(sizes.n_ring_blocks);
    MD_REQUIRE(n_ring_blocks_ >= ring_len_, "the KV ring pool of ", n_ring_blocks_, " blocks is smaller than one ring (",
               ring_len_, " blocks of ", options_.kv_block_size, " tokens for the sliding window of ",
               c.max_sliding_window(), ")");
    CUDA_CHECK(cudaMalloc(&kv_ring_, static_cast<size_t>(pools.ring_block_bytes) * n_ring_blocks_));
    CUDA_CHECK(cudaMemset(kv_ring_, 0, static_cast<size_t>(pools.ring_block_bytes) * n_ring_blocks_));
  }
}

prefill::KvCacheView CudaBackend::kv_view() const {
  return prefill::KvCacheView{kv_, n_kv_blocks_, options_.kv_block_size, kv_ring_, n_ring_blocks_, ring_len_};
}

size_t CudaBackend::kv_cache_elements() const {
  const ModelConfig& c = config();
  return static_cast<size_t>(n_full_layers_) * 2 * n_kv_blocks_ * c.n_kv_heads * options_.kv_block_size * c.head_dim;
}

size_t CudaBackend::kv_ring_elements() const {
  const ModelConfig& c = config();
  return static_cast<size_t>(n_ring_layers_) * 2 * n_ring_blocks_ * c.n_kv_heads * options_.kv_block_size * c.head_dim;
}

}  // namespace megadecode::cuda
