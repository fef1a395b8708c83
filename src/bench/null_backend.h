// The `null` backend of `megadecode bench engine`: the host side of a cuda-mk decode step without
// the device. Per step it does what CudaBackend does on the host — checks every row, plans
// (StepPlanner, patched; or make_plan per step, as cuda-mk at 0f6c589 does), packs the inputs
// into one of two staging buffers (host memory standing in for the pinned double buffers),
// "uploads" the tasks and recomputes the launch ranges when the lists changed (fresh plans: when
// a byte compare finds a change, as cuda-mk does) — and returns fixed tokens: row i's token is
// token_cycle[(its new position) % size], whatever the batch. The "device" runs each step for
// device_us after the previous one ends, so the engine's overlap shows in steps/s.
// Batches above the megakernel's 64 rows model the host work of the batched decode path (another
// engineer's GPU path): inputs staged per row (tokens, positions, block tables, sampling), no plan
// (stage_batched_step).
// Threading: one caller at a time (Backend's contract).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "plan/plan.h"
#include "plan/policy.h"
#include "plan/step_planner.h"

namespace megadecode {

struct NullBackendOptions {
  int n_sms = 132;               // the plan's SMs (an H200's)
  std::string policy = "default";
  bool patch_plan = true;        // StepPlanner; false: make_plan every step
  double device_us = 0.0;        // each step's device time
  std::vector<int32_t> token_cycle = {0};  // the tokens returned, by position
  // The top logprobs a row gets from the "device" (a CUDA backend's row_logprobs: the engine asks
  // for no logits); -1: none, so a row with logprobs makes the engine take the logits [rows][vocab]
  // and compute them on its thread (the path before device logprobs).
  int device_logprobs = 20;
};

class NullBackend : public Backend {
 public:
  static constexpr int kMaxMegakernelBatch = 64;  // the megakernel's token groups (cuda_backend.cu)

  // From BackendOptions: kv_block_size and n_kv_blocks (> 0).
  NullBackend(const ModelConfig& config, const BackendOptions& options, const NullBackendOptions& null);

  std::string name() const override { return "null"; }
  const ModelConfig& config() const override { return config_; }
  int kv_block_size() const override { return block_size_; }
  int n_kv_blocks() const override { return n_kv_blocks_; }

  void prefill(const SeqChunk& chunk, std::span<float> last_logits) override;
  void decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) override;
  DecodeTicket decode_async(std::span<const DecodeSeq> seqs, bool want_logits) override;
  void collect(DecodeTicket ticket, DecodeResult& result) override;
  bool runs_async() const override { return true; }
  int max_device_logprobs() const override { return null_.device_logprobs; }

  const StepPlanner::Counts& plan_counts() const { return planner_.counts(); }

 private:
  using Time = std::chrono::steady_clock::time_point;
  struct Step {
    uint64_t ticket;
    Time done_at;  // when the device would have finished it
    std::vector<int32_t> tokens;
    bool want_logits;
    std::vector<int> logprobs;  // [rows] each row's DecodeSeq::logprobs
  };
  BatchState check_rows(std::span<const DecodeSeq> seqs);
  void stage_megakernel_step(const BatchState& batch, DecodeTimes& times);
  void stage_batched_step(const BatchState& batch);

  ModelConfig config_;
  int block_size_;
  int n_kv_blocks_;
  NullBackendOptions null_;
  Policy policy_;
  StepPlanner planner_;
  Plan fresh_;                           // patch_plan off: this step's make_plan
  std::vector<uint8_t> staging_[2];      // the pinned double buffer
  int next_staging_ = 0;
  std::vector<Task> device_tasks_;       // the device's task buffer
  std::vector<int32_t> device_ranges_;   // the device's launch ranges
  std::vector<int32_t> tokens_;          // scratch: the step's input tokens (-1 - r: chained)
  std::vector<SamplingParams> sampling_;  // scratch
  std::deque<Step> in_flight_;
  uint64_t next_ticket_ = 1;
  Time device_free_at_{};
};

}  // namespace megadecode
