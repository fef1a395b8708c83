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
// Composition: the megakernel step (megakernel_step.h) and the batched step (cuda/batched) over the
// backend's KV pools and stream; the rows are checked once (engine/decode_rows.h); benchmarks and
// tests reach the steps through probe() (cuda_probe.h).
// Asynchronous steps (the engine's overlapped loop, Backend::decode_async): a step is enqueued and
// decode_async returns; collect() waits for its event. Each step leaves its tokens in a device
// buffer too, from which a chained row of the next step (prev_row) takes its input token, so step
// N+1 runs before the host has seen step N's tokens. decode() is decode_async + collect. A step
// with a penalised row (the host samples it from the logits) or with routing capture on is
// finished inside decode_async, after every older step.
// Threading: one caller at a time (Backend's contract).
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/backend/cuda_probe.h"
#include "cuda/backend/device_weights.h"
#include "cuda/backend/megakernel_step.h"
#include "cuda/batched/batched_step.h"
#include "cuda/prefill/prefill_runner.h"
#include "engine/backend.h"
#include "engine/decode_path.h"
#include "model/routing.h"

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
  DecodeTicket decode_async_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs,
                                  bool want_logits) override;
  void collect(DecodeTicket ticket, DecodeResult& result) override;
  bool runs_async() const override { return true; }
  // Logprobs on the device (row_logprobs): a step whose rows ask for them copies back
  // kMaxTopLogprobs pairs a row, not the logits.
  int max_device_logprobs() const override;
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

  // The benchmarks' and tests' door into the steps (cuda_probe.h).
  CudaProbe& probe() { return probe_; }

  // ---- the device state, for tests and benchmarks ----
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
  // Records into `log` the experts and weights every processed token (decode steps and prefill
  // pieces, keyed by sequence id and position) chose in every layer; nullptr turns it off. The log
  // must outlive its use.
  void set_routing_capture(RoutingLog* log);

 private:
  friend class CudaProbe;

  void allocate_kv();
  prefill::KvCacheView kv_view() const;
  // A step launched and not yet collected; finished: its result (or its error) is in.
  struct Pending {
    uint64_t id = 0;
    DecodePath path = DecodePath::kMegakernel;
    bool finished = false;
    std::vector<int> logprobs;  // [rows] each row's DecodeSeq::logprobs; empty: none asked
    DecodeResult result;
    std::exception_ptr error;
  };
  void launch_step(DecodePath path, std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs,
                   bool want_logits, bool want_logprobs);
  void finish(Pending& step);
  // Finishes the step and adds what the host owes it (cuda_backend_host.cu): the routing, the
  // penalised rows' tokens (and those tokens in the chain buffer). An error lands in step.error.
  void complete_on_host(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs, Pending& step);
  // Resamples the sequences with penalties on the host from their logits rows (row(i, dst) copies
  // sequence i's row).
  void resample_penalised(std::span<const DecodeSeq> seqs, DecodeResult& result,
                          const std::function<void(size_t, std::vector<float>&)>& row);
  void record_routing(int64_t seq, int first_pos, int n_tokens, const int32_t* experts, const float* weights);
  // Test only (device_fault.h): before the step MEGADECODE_TEST_DEVICE_FAULT_STEP names, a fault.
  void maybe_fault();

  std::shared_ptr<const DeviceWeights> weights_;
  BackendOptions options_;
  DecodePathPolicy path_policy_;
  DecodePath last_path_ = DecodePath::kMegakernel;
  int n_sms_ = 0;
  int n_kv_blocks_ = 0;
  uint16_t* kv_ = nullptr;
  // Models with sliding-window layers: those layers' K/V in a ring a sequence (kv/kv_cache.h),
  // ring_len_ = kv_ring_length(W, block size) blocks of n_ring_blocks_.
  int n_ring_layers_ = 0, ring_len_ = 0, n_ring_blocks_ = 0;
  int n_full_layers_ = 0;  // the other layers: their K/V in the full pool (kv_)
  uint16_t* kv_ring_ = nullptr;
  cudaStream_t stream_ = nullptr;
  RoutingLog* routing_log_ = nullptr;
  int fault_step_ = -1;  // test only (device_fault.h): the decode step that faults
  int64_t n_decode_steps_ = 0;
  std::unique_ptr<prefill::PrefillRunner> prefill_;  // prefill_chunk > 0
  std::unique_ptr<MegakernelStep> megakernel_;       // cuda, cuda-mk, cuda-ops
  std::unique_ptr<batched::BatchedStep> batched_;    // cuda, cuda-batched
  std::deque<Pending> pending_;  // launch order
  uint64_t next_ticket_ = 1;
  int32_t* chain_ = nullptr;  // device: the tokens of the last decode step launched, [chain_rows_]
  int chain_rows_ = 0;
  CudaProbe probe_{*this};
};

}  // namespace megadecode::cuda
