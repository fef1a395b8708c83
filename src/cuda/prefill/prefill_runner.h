// PrefillRunner: one prompt piece (1..max_chunk tokens at positions start_pos..) through the whole
// model as ordinary kernels on one stream — embedding, per layer norm / QKV GEMM / q,k norm + RoPE
// + paged KV write / causal attention / O-proj + residual / norm / router / top-k / device-built
// expert lists / grouped gate-up and down GEMMs / combine (fused into the next norm) — then the
// final norm and LM head of the last token. Owns its activation workspace (sized for max_chunk
// at construction); the weights (cuda/backend/device_weights.h builds them) and the KV cache
// belong to the caller (CudaBackend), which keeps them alive while the runner lives.
// Threading: one caller at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/common/kernel_marks.h"
#include "cuda/gemm/gemm_plan.h"
#include "cuda/megakernel/types.h"
#include "cuda/prefill/prefill_index.h"
#include "model/config.h"

namespace megadecode::cuda::prefill {

// The caller's paged KV cache of the full-attention layers (engine/kv_pools.h): [n_full_layers][2 (K, V)]
// [n_blocks][n_kv_heads][block_size][head_dim] bf16, layer l at its MkLayerWeights::kv_full_index;
// with sliding-window layers also their ring pool (kv/kv_cache.h): [n_ring_layers][2][n_ring_blocks]
// [n_kv_heads][block_size][head_dim] bf16, layer l at its MkLayerWeights::kv_ring_index, a sequence
// holding ring_len blocks of it at most.
struct KvCacheView {
  uint16_t* data = nullptr;
  int n_blocks = 0;
  int block_size = 0;
  uint16_t* ring = nullptr;
  int n_ring_blocks = 0;
  int ring_len = 0;
};

// Error unless tokens (any number >= 1) at positions start_pos.. can run on this model and cache:
// token ids in the vocabulary, positions below max_position_embeddings, the block table covering
// them with blocks of the cache. Returns the number of table entries they use. (Prefill pieces, and
// the prompt pieces of the batched step's mixed steps.)
size_t check_prompt_piece(const ModelConfig& config, std::span<const int32_t> tokens, int start_pos,
                          std::span<const int32_t> block_table, const KvCacheView& kv);

class PrefillRunner {
 public:
  // `view`: the device pointers of every weight; `layers`: a host copy of each layer's pointers.
  PrefillRunner(const ModelConfig& config, const MkModelWeights& view, std::span<const MkLayerWeights> layers,
                int max_chunk);
  ~PrefillRunner();
  PrefillRunner(const PrefillRunner&) = delete;
  PrefillRunner& operator=(const PrefillRunner&) = delete;

  // Bytes of device workspace a runner of this shape allocates.
  static size_t workspace_bytes(const ModelConfig& config, int max_chunk);
  int max_chunk() const { return max_chunk_; }

  // check_prompt_piece on this runner's model, and for a model with sliding-window layers the ring
  // pool and the sequence's ring table (min(ring_len, blocks up to the last position) valid entries,
  // ring_len at most; none without such layers). Returns the block-table entries the tokens use.
  size_t check(std::span<const int32_t> tokens, int start_pos, std::span<const int32_t> block_table,
               const KvCacheView& kv, std::span<const int32_t> ring_table = {}) const;
  // The ring entries a sequence holds at most (0 for a model without sliding layers).
  int ring_length(const KvCacheView& kv) const;

  // Runs tokens (1..max_chunk) at positions start_pos.., writing their K/V through block_table
  // (and, a model with sliding-window layers, those layers' through ring_table: min(ring_len,
  // blocks up to the last position) entries of the ring pool at least, ring_len at most), then,
  // when last_logits is non-empty ([vocab]), the last token's logits. Synchronous: returns after
  // the stream has finished. Error for bad tokens, positions or tables (checked before anything
  // runs) and for a failure the device reports.
  void run(std::span<const int32_t> tokens, int start_pos, std::span<const int32_t> block_table,
           const KvCacheView& kv, std::span<float> last_logits, cudaStream_t stream,
           std::span<const int32_t> ring_table = {});

  // Routing capture (tests; off by default, nothing is copied when off): after run(), the
  // experts and weights the piece's tokens chose, [n_tokens][n_layers][top_k] each.
  void set_routing_capture(bool on);
  // Benchmarks: an event after each launch of the next run() calls into `marks` (nullptr: off).
  void set_kernel_marks(KernelMarks* marks) { marks_ = marks; }
  void read_routing(int n_tokens, std::vector<int32_t>& experts, std::vector<float>& weights) const;

 private:
  void enqueue_layer(int layer, int n_tokens, int start_pos, const KvCacheView& kv, cudaStream_t stream);
  // h = x + O-proj(attn), and a sequential block's post norm into xn_.
  void enqueue_o_proj(int layer, int n_tokens, cudaStream_t stream);
  // The MoE FFN of xn_ into down_ (router, top-k, lists, grouped GEMMs).
  void enqueue_moe(int layer, int n_tokens, cudaStream_t stream);
  // A sliding layer's scratch for pieces of up to max_chunk tokens at this block size (grown once).
  void ensure_scratch(int block_size);

  ModelConfig config_;
  MkModelWeights view_;
  std::vector<MkLayerWeights> layers_;
  int max_chunk_ = 0;
  uint8_t* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  int32_t* block_table_ = nullptr;  // device, grown on demand
  size_t block_table_capacity_ = 0;
  uint8_t* staging_ = nullptr;      // pinned: tokens then the block table
  size_t staging_bytes_ = 0;
  int32_t* error_host_ = nullptr;   // pinned
  int tile_capacity_ = 0;
  int n_ring_layers_ = 0;             // sliding-window layers (their K/V in the ring pool)
  int32_t* ring_table_ = nullptr;     // device [ring_len] of the piece's sequence
  int ring_table_capacity_ = 0;
  // A sliding layer's piece runs in a linear scratch of whole blocks (prefill_index.h
  // sliding_piece): K and V [scratch_blocks_][G][B][D] bf16, read through the identity table.
  uint16_t* scratch_ = nullptr;
  int scratch_blocks_ = 0, scratch_block_size_ = 0;
  int32_t* scratch_table_ = nullptr;  // [scratch_blocks_]: 0, 1, 2, ...

  // Views into arena_ (shapes for C = max_chunk rows).
  int32_t* tokens_ = nullptr;       // [C]
  int32_t* error_ = nullptr;        // [1] device error word
  float* x_ = nullptr;              // [C][H] fp32 residual stream, layer input
  float* h_ = nullptr;              // [C][H] fp32 after attention
  uint16_t* xn_ = nullptr;          // [C][H] bf16 normed input of the current sub-block
  float* qkv_ = nullptr;            // [C][G*(gs+2)*D] fp32, fused group-major
  uint16_t* q_ = nullptr;           // [C][n_heads][D] bf16
  uint16_t* attn_ = nullptr;        // [C][n_heads*D] bf16
  float* router_ = nullptr;         // [C][E] fp32
  int32_t* topk_ids_ = nullptr;     // [C][K]
  float* topk_w_ = nullptr;         // [C][K]
  int32_t* rank_ = nullptr;         // [C*K]
  int32_t* token_slot_ = nullptr;   // [C*K]
  int32_t* counts_ = nullptr;       // [E]
  int32_t* offsets_ = nullptr;      // [E+1]
  int32_t* n_tiles_ = nullptr;      // [1]
  gemm::MoeTile* tiles_ = nullptr;  // [tile_capacity]
  uint16_t* hidden_ = nullptr;      // [C*K][I] bf16 SiLU(gate)*up per slot (a dense layer: [C][dense I])
  float* down_ = nullptr;           // [C*K][H] fp32 expert outputs per slot
  uint16_t* xf_ = nullptr;          // [H] bf16 final-normed last token
  float* logits_ = nullptr;         // [V] fp32
  KernelMarks* marks_ = nullptr;     // set_kernel_marks
  int32_t* route_ids_ = nullptr;    // [C][n_layers][K] routing capture (set_routing_capture)
  float* route_w_ = nullptr;
};

}  // namespace megadecode::cuda::prefill
