// BatchedStep: the throughput decode step. One new token for each of up to max_rows sequences runs
// as ordinary kernels over one row per sequence, all on one stream with no host sync inside:
// per layer the input norm (fused with the embedding gather or the previous layer's MoE combine)
// -> QKV GEMM -> q/k norm + RoPE + the paged KV write at each row's own position -> split-K paged
// decode attention -> O-proj GEMM + residual -> norm -> router GEMM -> top-k -> per-expert lists
// built on the device -> grouped gate/up (SiLU * up) and down GEMMs, each active expert's weights
// read once per tile column; then the final norm, the LM head and the device row sampler.
// Parallel blocks (cohere2_moe): the FFN reads the input norm (no post norm), its output and the
// O-proj's both add to x; a dense layer's FFN is two dense GEMMs; no q/k norms; RoPE interleaved
// on the layers that use it (NoPE on the others); a sliding layer's K/V in the row's ring of the
// ring pool, its attention over the last `window` keys; logits times logit_scale.
// The GEMMs are the many-row engine's (cuda/gemm); the norms, RoPE and MoE lists the prefill
// kernels' (cuda/prefill/prefill_kernels.h), so the arithmetic and rounding points are prefill's.
// A step runs row_bucket(n) rows (the rest padding: position -1, no KV write, no routing, no
// sampling); its first run per shape (row bucket, block-table stride; with prompt pieces also the
// decode rows' bucket) is eager, the second captures it as a CUDA graph that later steps replay
// with new inputs: one upload, one graph launch, one copy of the tokens back. (A graph holds the
// KV cache's pointer: one cache per BatchedStep.) launch() enqueues a step and returns; finish()
// waits for the oldest: two steps may be in flight (the engine's overlapped loop), each with its
// own pinned staging and outputs.
// Batch invariance: a row's tokens and logits are bitwise the same in any batch (every sum's order
// depends on the row alone: gemm_plan.h, batched_plan.h).
// The weights and the KV cache belong to the caller (CudaBackend). Threading: one caller at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/batched/batched_plan.h"
#include "cuda/common/kernels.h"
#include "cuda/common/pinned.h"
#include "cuda/common/step_outputs.h"
#include "cuda/common/kernel_marks.h"
#include "cuda/gemm/gemm_plan.h"
#include "cuda/megakernel/types.h"
#include "cuda/prefill/prefill_kernels.h"
#include "cuda/prefill/prefill_runner.h"
#include "model/config.h"
#include "sampling/params.h"

namespace megadecode::cuda::batched {

// One sequence's row of a step: its new token at `position`, its block table covering
// position + 1 keys, how its next token is drawn; with sliding-window layers also its ring table
// (min(ring_len, position / block_size + 1) blocks of the ring pool at least, ring_len at most);
// with a token mask (structured output, DecodeSeq::allowed) only the tokens it allows are sampled.
struct StepRow {
  int32_t token = 0;
  int position = 0;
  std::span<const int32_t> block_table;
  SamplingParams sampling;
  std::span<const int32_t> ring_table;
  std::span<const uint32_t> allowed;  // [ceil(vocab / 32)] packed words, empty: any token
  // >= 0: the row's token is the one the previous step sampled for its row prev_row, read on the
  // device from launch()'s `chain` (`token` is ignored).
  int prev_row = -1;
};

// A piece of one prompt riding in a step (a mixed step): tokens at positions start_pos.., written
// to the cache through block_table (covering them); nothing is sampled for them.
struct PromptPiece {
  std::span<const int32_t> tokens;
  int start_pos = 0;
  std::span<const int32_t> block_table;
};

class BatchedStep {
 public:
  // max_prompt_rows: prompt tokens a mixed step may carry beside max_rows decode rows (0: none);
  // the two together at most kMaxRows.
  BatchedStep(const ModelConfig& config, const MkModelWeights& view, std::span<const MkLayerWeights> layers,
              int max_rows, int max_prompt_rows = 0);
  ~BatchedStep();
  BatchedStep(const BatchedStep&) = delete;
  BatchedStep& operator=(const BatchedStep&) = delete;

  static constexpr int kMaxRows = 1024;
  int max_rows() const { return max_rows_; }
  // Bytes of device workspace a step of this shape allocates up front (attention partials and
  // block tables grow with the contexts on top of it).
  static size_t workspace_bytes(const ModelConfig& config, int max_rows, int max_prompt_rows = 0);
  int max_prompt_rows() const { return max_prompt_rows_; }

  // Error (before anything runs) for a bad token, position or block table; then enqueues the step
  // on `stream` and returns: it writes each row's K/V and samples its next token. Prompt pieces (a
  // mixed step; at most max_prompt_rows tokens in all) ride beside the decode rows: their rows
  // follow the decode rows through every GEMM, norm and expert list, so each expert's weights are
  // read once for both; their attention is prefill's causal attention over a work list of the
  // pieces' query tiles (attn_work.h); they get no LM head and no sampling. Graphs as for plain
  // steps, per (row bucket, decode row bucket, stride): the pieces are inputs. A decode row's
  // tokens and logits are bitwise those of the step without the pieces. Chained rows (prev_row)
  // read chain[prev_row] (device memory); the step's tokens are copied to chain[0, rows) after it.
  // With want_logits the raw logits come back too. At most two steps in flight.
  // With want_logprobs every decode row's logprobs come back too (row_logprobs).
  void launch(std::span<const StepRow> rows, std::span<const PromptPiece> prompts, const prefill::KvCacheView& kv,
              cudaStream_t stream, int32_t* chain, bool want_logits, bool want_logprobs);
  // Waits for the oldest step in flight: its tokens [rows] and, when asked at launch, its logits
  // [rows][vocab] and logprobs [rows] (else empty). A failure the device reports is an Error.
  void finish(std::vector<int32_t>& tokens, std::vector<float>& logits, std::vector<RowLogprobs>& logprobs);
  int in_flight() const { return static_cast<int>(n_launched_ - n_finished_); }

  // Row r's logits of the last step ([vocab] fp32, device memory, valid until the next run).
  const float* logits_row(int r) const;

  // ---- benchmark hooks ----
  // Replays the last step's graph warmup + reps times (same inputs: the same KV slots are written)
  // and returns the milliseconds of each timed replay (CUDA events); checks the error word.
  std::vector<float> time_last_step(int warmup, int reps, cudaStream_t stream);
  // Runs the last step once more eagerly with an event after every launch and returns the
  // milliseconds spent per kernel (summed over the layers), in step order; launch gaps included.
  std::vector<std::pair<std::string, double>> profile_last_step(cudaStream_t stream);

  // Test only: fills every activation buffer with NaN before each step (the split-K semaphores
  // excepted: they must stay zero), so anything a step reads that it did not write shows.
  void set_poison(bool on) { poison_ = on; }

  // Routing capture (tests; off by default): after run(), the experts and weights each row chose,
  // [rows][n_layers][top_k] each. A mixed step's prompt rows start at prompt_row0(decode rows).
  void set_routing_capture(bool on);
  void read_routing(int n_rows, std::vector<int32_t>& experts, std::vector<float>& weights) const;
  static int prompt_row0(int decode_rows) { return row_bucket(decode_rows); }

 private:
  struct Inputs;
  // A step's shape, the key of its graph: `rows` rows in all (GEMMs, norms, expert lists; a row
  // bucket), of which the first `decode_rows` (a bucket too) are decode rows (attention splits,
  // LM head, sampling); the rest are prompt pieces' rows, then padding. `stride`: block-table
  // entries a decode row; `ring_len`: ring-table entries a decode row (0: no sliding layers).
  struct Shape {
    int rows = 0, decode_rows = 0, stride = 0, ring_len = 0;
    std::tuple<int, int, int, int> key() const { return {rows, decode_rows, stride, ring_len}; }
  };
  // The inputs' layout of a shape (prompt tables last: their length may change under one graph).
  Inputs inputs(const Shape& shape, int prompt_table_entries = 0) const;
  void check_rows(std::span<const StepRow> rows, const prefill::KvCacheView& kv) const;
  void ensure_capacity(const Shape& shape, int prompt_table_entries, int total_splits);
  void enqueue_step(const Shape& shape, const prefill::KvCacheView& kv, cudaStream_t stream);
  void enqueue_layer(int layer, const Shape& shape, const prefill::KvCacheView& kv, cudaStream_t stream);
  // The FFN of a parallel block's dense layer on the input norm xn_: two dense GEMMs into down_
  // ([R][H], added to h_ by the next norm).
  void enqueue_dense_ffn(int layer, const Shape& shape, cudaStream_t stream);
  void drop_graphs();
  cudaGraphExec_t graph_for(const Shape& shape, const prefill::KvCacheView& kv, cudaStream_t stream);

  ModelConfig config_;
  MkModelWeights view_;
  std::vector<MkLayerWeights> layers_;
  int max_rows_ = 0;      // row_bucket of the constructor's max_rows
  int max_prompt_rows_ = 0;
  int max_all_rows_ = 0;  // row_bucket(max_rows_ + max_prompt_rows_): the row buffers' size
  int qkv_splits_ = 1, o_splits_ = 1, router_splits_ = 1;
  int n_ring_layers_ = 0;  // sliding-window layers (their K/V in the ring pool)
  int tile_capacity_ = 0;
  bool poison_ = false;

  uint8_t* arena_ = nullptr;  // fixed-size buffers (views below)
  size_t arena_bytes_ = 0;
  uint8_t* inputs_ = nullptr;       // device: the per-step inputs, one upload (layout: Inputs)
  size_t inputs_capacity_ = 0;
  // What one step in flight holds on the host: the pinned inputs and token masks it uploads, its
  // outputs (the error word, tokens [max_rows], then logits when asked) and the event they are
  // ready at.
  struct Slot {
    PinnedBuffer staging, masks, outputs;
    cudaEvent_t done = nullptr;
    int rows = 0;
    StepOutputTail tail;  // logits and logprobs, when asked
  };
  Slot slots_[2];
  uint64_t n_launched_ = 0, n_finished_ = 0;
  float* part_o_ = nullptr;         // attention partials, [split_capacity][n_heads][head_dim]
  float* part_ml_ = nullptr;
  int split_capacity_ = 0;
  float* piece_part_o_ = nullptr;   // a mixed step's split prompt attention: partials of
  float* piece_part_ml_ = nullptr;  // piece_attn_ctas_ CTAs (prefill::AttnArgs work mode)
  int piece_attn_ctas_ = 0;         // one an SM: the work list's split target and its CTAs
  int32_t* route_ids_ = nullptr;    // [max_rows][n_layers][top_k] routing capture (device)
  float* route_w_ = nullptr;

  // Views into arena_ (R = max_rows rows).
  int32_t* error_ = nullptr;        // [1]
  float* x_ = nullptr;              // [R][H] fp32 residual stream
  float* h_ = nullptr;              // [R][H] fp32 after attention
  uint16_t* xn_ = nullptr;          // [R][H] bf16 normed input of the current sub-block
  float* qkv_ = nullptr;            // [R][G*(gs+2)*D] fp32
  uint16_t* q_ = nullptr;           // [R][n_heads][D] bf16
  uint16_t* attn_ = nullptr;        // [R][n_heads*D] bf16
  float* router_ = nullptr;         // [R][E]
  int32_t* topk_ids_ = nullptr;     // [R][K]
  float* topk_w_ = nullptr;         // [R][K]
  int32_t* rank_ = nullptr;         // [R*K]
  int32_t* token_slot_ = nullptr;   // [R*K]
  int32_t* counts_ = nullptr;       // [E]
  int32_t* offsets_ = nullptr;      // [E+1]
  int32_t* n_tiles_ = nullptr;      // [1]
  gemm::MoeTile* tiles_ = nullptr;  // [tile_capacity]
  uint16_t* hidden_ = nullptr;      // [R*K][I] bf16
  float* down_ = nullptr;           // [R*K][H] fp32
  uint16_t* xf_ = nullptr;          // [R][H] bf16 final-normed
  float* logits_ = nullptr;         // [R][V] fp32
  int32_t* out_tokens_ = nullptr;   // [R]
  float* split_ws_ = nullptr;       // split-K partials of the dense GEMMs (gemm::workspace_floats)
  int32_t* split_sem_ = nullptr;    // their semaphores (zeroed once)
  // Token masks of the constrained rows, [n_masked][ceil(V/32)] words (slot k at k * words; the
  // step's inputs hold each decode row's slot, -1: any token), uploaded from the slot's pinned masks
  // in a step with a constrained row. Allocated for max_rows_ rows by the first such step (the
  // graphs are recaptured then); until then the sampler is launched without masks.
  uint32_t* masks_ = nullptr;
  RowLogprobs* logprobs_ = nullptr;  // [max_rows_], allocated by the first step that asks

  // The last step's shape and the step graphs per shape; seen_: shapes that ran once eagerly (the
  // next step of the shape captures its graph).
  int last_rows_ = 0;
  Shape last_shape_;
  prefill::KvCacheView last_kv_;
  std::map<std::tuple<int, int, int, int>, cudaGraphExec_t> graphs_;
  std::set<std::tuple<int, int, int, int>> seen_;
  KernelMarks* marks_ = nullptr;  // profile_last_step: an event after each launch
};

}  // namespace megadecode::cuda::batched
