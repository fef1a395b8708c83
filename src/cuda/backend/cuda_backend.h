// The CUDA backends, over one set of device weights and one paged KV cache:
//   cuda          each step on the path the engine's policy picks (engine/decode_path.h): the
//                 megakernel for small batches, the batched step from the crossover measured at
//                 start-up (path_calibration.h; set_path_policy);
//   cuda-mk       every step as ONE launch of the persistent megakernel (batches of 1..64);
//   cuda-ops      the megakernel's tile code one launch per operation wave, in a CUDA graph (the
//                 baseline the megakernel is measured against); both run the Plan from src/plan;
//   cuda-batched  every step as the batched step (cuda/batched: the many-row GEMM engine, split-K
//                 paged attention; batches of 1..max_batch).
// Options: BackendOptions (engine/backend.h), as the factory got them.
// Prefill: with prefill_chunk > 0, ordinary kernels over pieces of at most prefill_chunk tokens
// (src/cuda/prefill; a sliding layer's piece in a scratch beside its ring); with 0, the decode path
// one token at a time (the comparison baseline).
// Sampling runs on the device (greedy, temperature, top-k, top-p, min-p; seeded by (seed,
// position)); a sequence with presence/frequency/repetition penalties (they need its token
// history) reads its logits row back and is sampled by the host sampler, the same Gumbel draw.
// Threading: one caller at a time (Backend's contract).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/backend/device_weights.h"
#include "cuda/batched/batched_step.h"
#include "cuda/prefill/prefill_runner.h"
#include "engine/backend.h"
#include "engine/decode_path.h"
#include "model/routing.h"
#include "plan/plan.h"
#include "plan/step_planner.h"
#include "plan/policy.h"

namespace megadecode::cuda {

class CudaBackend : public Backend {
 public:
  // options.backend: cuda, cuda-mk, cuda-ops or cuda-batched; the CUDA fields of BackendOptions apply.
  CudaBackend(std::shared_ptr<const DeviceWeights> weights, const BackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return options_.backend; }
  const ModelConfig& config() const override { return weights_->config(); }
  int kv_block_size() const override { return options_.kv_block_size; }
  int n_kv_blocks() const override { return n_kv_blocks_; }
  int n_ring_blocks() const override { return n_ring_blocks_; }
  int max_decode_batch() const override;

  void prefill(const SeqChunk& chunk, std::span<float> last_logits) override;
  void decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) override;
  // Mixed steps (cuda, cuda-batched with prefill_chunk > 0; not for a model with parallel blocks,
  // cohere2_moe, whose prompts run through prefill() before the step): the prompt pieces ride in
  // the batched step beside the decode rows, up to the batched step's kMaxRows rows in all.
  void decode_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs, bool want_logits,
                    DecodeResult& result) override;
  int max_mixed_prompt_rows() const override;

  // The path of the last decode step, and the policy the `cuda` backend asks.
  DecodePath last_path() const { return last_path_; }
  const DecodePathPolicy& path_policy() const { return path_policy_; }
  // The policy the next steps follow (path_calibration.h measures it at start-up).
  void set_path_policy(const DecodePathPolicy& p) { path_policy_ = p; }
  int n_sms() const { return n_sms_; }

  // ---- test hooks ----
  // The paged KV cache of the full-attention layers: [n_full_layers][2 (K, V)][n_kv_blocks][n_kv_heads]
  // [block_size][head_dim] bf16, layer l at its MkLayerWeights::kv_full_index (l itself when no
  // layer slides).
  uint16_t* kv_cache() const { return kv_; }
  size_t kv_cache_elements() const;
  // The ring pool of the sliding-window layers (nullptr without):
  // [n_ring_layers][2 (K, V)][n_ring_blocks][n_kv_heads][block_size][head_dim] bf16.
  uint16_t* kv_ring() const { return kv_ring_; }
  size_t kv_ring_elements() const;
  int ring_length() const { return ring_len_; }  // R: ring blocks a sequence holds at most; 0 without
  // The plan of the last megakernel step and its counters after the step.
  const Plan& last_plan() const { return plan_; }
  std::vector<int32_t> read_counters() const;
  // Counters that differ from the plan's exact totals after the last step ("" when none).
  std::string check_counter_totals() const;
  // Test only: adds 1 to the first wait target of plan task `task` in the next steps (-1: off),
  // so that wait can never be satisfied.
  void set_stuck_task(int task) { stuck_task_ = task; }
  // Test only: fills every activation buffer of the step with NaN before the launch (both paths).
  void set_poison_activations(bool on) {
    poison_ = on;
    if (batched_) batched_->set_poison(on);
  }
  // Test only: records into `log` the experts and weights every processed token (decode steps and
  // prefill pieces, keyed by sequence id and position) chose in every layer; nullptr turns it off.
  // The log must outlive its use.
  void set_routing_capture(RoutingLog* log);

  // ---- benchmark hooks (bench decode) ----
  // Replays the last decode step `warmup` + `reps` times as a CUDA graph (cuda-ops: its per-wave
  // graph; cuda-mk: the counter/error memsets and the one launch, captured once; the batched
  // path: its step graph) and returns the
  // milliseconds of each timed replay (CUDA events around the graph launch). The step is
  // idempotent (same inputs, same KV slot written), so replays do the same work; the device
  // error word is checked after every replay.
  std::vector<float> time_last_step(int warmup, int reps);
  // The batched path's last step once more with an event after every launch: milliseconds per
  // kernel, summed over the layers (empty when the last step ran on the megakernel).
  std::vector<std::pair<std::string, double>> profile_last_step();
  // The next prefill() with an event after every launch: milliseconds per kernel of all its pieces,
  // summed over the layers. Error when this backend prefills without the prefill runner.
  std::vector<std::pair<std::string, double>> profile_prefill(const SeqChunk& chunk);
  // Bytes of one buffer of the last step's arena (e.g. moe_n_items), copied to the host.
  std::vector<uint8_t> read_buffer(const BufferSpan& span) const;
  // Per-SM trace of the following launches (trace.h): capacity records per SM and role; 0 turns
  // it off. Either way a decode() must follow before time_last_step. read_trace() returns every
  // SM's records of the last launch (the last graph replay for cuda-ops: all its waves) and the
  // number dropped for lack of capacity.
  void enable_trace(int capacity_per_sm);
  std::vector<TraceRecord> read_trace(int64_t* dropped = nullptr) const;

 private:
  void decode_megakernel(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result);
  void decode_batched(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs, bool want_logits,
                      DecodeResult& result);
  void run_step(const BatchState& batch, std::span<const DecodeSeq> seqs);
  // A chunk's ring table: none without a ring pool; with one, checked when its step is built.
  void check_ring_table(const SeqChunk& chunk) const;
  // Resamples the sequences with penalties on the host from their logits rows (row(i, dst) copies
  // sequence i's row).
  void resample_penalised(std::span<const DecodeSeq> seqs, DecodeResult& result,
                          const std::function<void(size_t, std::vector<float>&)>& row);
  void ensure_capacity(const Plan& plan);
  void upload_inputs(std::span<const DecodeSeq> seqs);
  void launch(cudaStream_t stream);
  void check_error();
  void record_routing(int64_t seq, int first_pos, int n_tokens, const int32_t* experts, const float* weights);

  std::shared_ptr<const DeviceWeights> weights_;
  BackendOptions options_;
  bool per_op_ = false;  // cuda-ops: one launch per wave
  bool has_megakernel_ = false, has_batched_ = false;
  DecodePathPolicy path_policy_;
  DecodePath last_path_ = DecodePath::kMegakernel;
  Policy policy_;
  int n_sms_ = 0;
  int n_kv_blocks_ = 0;
  uint16_t* kv_ = nullptr;
  // Models with sliding-window layers: those layers' K/V in a ring a sequence (kv/kv_cache.h),
  // ring_len_ = kv_ring_length(W, block size) blocks of n_ring_blocks_.
  int n_ring_layers_ = 0, ring_len_ = 0, n_ring_blocks_ = 0;
  int n_full_layers_ = 0;  // the other layers: their K/V in the full pool (kv_)
  uint16_t* kv_ring_ = nullptr;
  cudaStream_t stream_ = nullptr;

  std::unique_ptr<StepPlanner> planner_;  // the megakernel's plan per step (plan/step_planner.h)
  Plan plan_;
  uint8_t* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  uint8_t* counters_ = nullptr;
  size_t counters_bytes_ = 0;
  Task* tasks_ = nullptr;
  size_t tasks_capacity_ = 0;
  std::vector<Task> uploaded_tasks_;
  int32_t* ranges_ = nullptr;  // [n_waves + 1][2][n_sms]: per launch, begin and end of each SM's tasks
  size_t ranges_capacity_ = 0;
  MkError* error_ = nullptr;
  MkError* error_host_ = nullptr;  // pinned
  uint8_t* staging_ = nullptr;     // pinned host inputs (and, after them, the ring tables)
  size_t staging_bytes_ = 0;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t graph_exec_ = nullptr;
  int stuck_task_ = -1;
  bool poison_ = false;
  RoutingLog* routing_log_ = nullptr;
  int32_t* route_ids_ = nullptr;  // [64][n_layers][top_k] decode-step capture (device)
  float* route_w_ = nullptr;
  cudaGraphExec_t bench_exec_ = nullptr;  // cuda-mk step graph of time_last_step
  TraceRecord* trace_ = nullptr;
  int32_t* trace_counts_ = nullptr;
  int trace_capacity_ = 0;
  std::unique_ptr<prefill::PrefillRunner> prefill_;  // prefill_chunk > 0
  std::unique_ptr<batched::BatchedStep> batched_;    // cuda, cuda-batched
};

}  // namespace megadecode::cuda
