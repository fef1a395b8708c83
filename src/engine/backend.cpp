// The one range check of BackendOptions (backend.h).
#include "engine/backend.h"

#include "core/check.h"

namespace megadecode {

void check_backend_options(const BackendOptions& o) {
  MD_REQUIRE(o.kv_block_size >= 1 && o.kv_block_size <= BackendOptions::kMaxKvBlockSize,
             "--block-size must be in [1, ", BackendOptions::kMaxKvBlockSize, "], got ", o.kv_block_size);
  MD_REQUIRE(o.n_threads >= 0 && o.n_threads <= BackendOptions::kMaxThreads, "--threads must be in [0, ",
             BackendOptions::kMaxThreads, "], got ", o.n_threads);
  MD_REQUIRE(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0,
             "--gpu-memory-utilization must be in (0, 1], got ", o.gpu_memory_utilization);
  MD_REQUIRE(o.prefill_chunk >= 0 && o.prefill_chunk <= BackendOptions::kMaxPrefillChunk,
             "--prefill-chunk must be in [0, ", BackendOptions::kMaxPrefillChunk, "], got ", o.prefill_chunk);
  MD_REQUIRE(o.wait_timeout_ms >= 1, "wait_timeout_ms must be >= 1, got ", o.wait_timeout_ms);
  MD_REQUIRE(o.max_batch >= 1 && o.max_batch <= BackendOptions::kMaxBatch, "--max-num-seqs must be in [1, ",
             BackendOptions::kMaxBatch, "], got ", o.max_batch);
}

}  // namespace megadecode
