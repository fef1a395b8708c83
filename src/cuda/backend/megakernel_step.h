// MegakernelStep: one decode step on the megakernel, beside the batched step (cuda/batched). Per
// step: the plan (plan/step_planner.h) -> the inputs packed (plan/step_upload.h) into one of two
// pinned staging buffers and uploaded with the task lists and launch ranges -> chained rows' tokens
// resolved on the device -> counters and the error word zeroed -> one launch of the persistent
// kernel (cuda-mk) or one launch per wave in a CUDA graph (cuda-ops) -> the tokens, the error word
// and (when asked) the logits copied back -> an event. launch() returns there; finish() waits for
// the event and checks the error word (a watchdog timeout names the stuck counter). Two steps may
// be in flight (the engine's overlapped loop launches step N+1 before it collects step N): each
// has its own staging, pinned outputs, event and plan. It owns the step's arena, counters, task
// lists, error word, graphs, trace buffers and routing capture; the KV pools and the stream are the
// caller's (CudaBackend).
// Threading: one caller at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/common/kernels.h"
#include "cuda/common/pinned.h"
#include "cuda/common/step_outputs.h"
#include "cuda/megakernel/trace.h"
#include "cuda/megakernel/types.h"
#include "cuda/prefill/prefill_runner.h"
#include "engine/backend.h"
#include "model/config.h"
#include "plan/plan.h"
#include "plan/policy.h"
#include "plan/step_planner.h"
#include "sampling/params.h"

namespace megadecode::cuda {

struct MegakernelOptions {
  std::string name;         // the backend's name, for messages
  int n_sms = 0;            // SMs the plan deals tasks to (one CTA each)
  bool per_op = false;      // cuda-ops: one launch per wave, replayed as a graph
  int64_t wait_timeout_ms = 2000;  // bound on any single counter wait inside a step (BackendOptions)
  uint32_t kernel_flags = 0;       // MkFlag bits (cuda/megakernel/types.h)
};

class MegakernelStep {
 public:
  static constexpr int kMaxBatch = 64;  // sequences per step (the kernel's token groups)

  MegakernelStep(const ModelConfig& config, const MkModelWeights& weights, const Policy& policy,
                 const MegakernelOptions& options);
  ~MegakernelStep();
  MegakernelStep(const MegakernelStep&) = delete;
  MegakernelStep& operator=(const MegakernelStep&) = delete;

  // Enqueues the step of `rows` on `stream` against the pools of `kv` and returns. `batch` is the
  // rows' checked view (engine/decode_rows.h: check_decode_rows), which the plan is made from; the
  // uploaded block and ring tables are the rows' whole tables (up to the plan's row stride), the
  // bytes the device path has always had: packing only the blocks the step needs once broke
  // cuda-ops' consecutive one-token steps, a cause not yet pinned down. A row with prev_row >= 0
  // takes chain[prev_row] (device memory: the previous step's tokens); the step's own tokens are
  // copied to chain[0, batch) after it. At most two steps in flight: finish the older first.
  // Error for what the host can see wrong (shapes, ops); DeviceError for a failed CUDA call.
  // With want_logprobs every row's logprobs come back too (row_logprobs, cuda/common/kernels.h).
  void launch(std::span<const DecodeSeq> rows, const BatchState& batch, const prefill::KvCacheView& kv,
              cudaStream_t stream, int32_t* chain, bool want_logits, bool want_logprobs);
  // Waits for the oldest step in flight: its tokens [batch] and, when it was launched with
  // want_logits / want_logprobs, its logits [batch][vocab] / logprobs [batch] (else empty). Error
  // (naming the counter, the task or the input) when the device reported one.
  void finish(std::vector<int32_t>& tokens, std::vector<float>& logits, std::vector<RowLogprobs>& logprobs);
  int in_flight() const { return static_cast<int>(n_launched_ - n_finished_); }
  // Host seconds the last launch() spent planning and staging (DecodeTimes).
  double last_plan_seconds() const { return plan_s_; }
  double last_stage_seconds() const { return stage_s_; }
  // Logits rows [first_row, first_row + rows) of the last step launched, once it is finished and
  // before another is launched ([rows, vocab]; the penalised rows' host sampling).
  void read_logits(size_t first_row, std::span<float> out) const;

  // The experts and weights each row chose in every layer in the following steps ([n_rows][n_layers]
  // [top_k]; a dense layer as expert -1, weight 0, as cpu-mk records it).
  void set_routing_capture(bool on);
  void read_routing(int n_rows, std::vector<int32_t>& experts, std::vector<float>& weights) const;

  // ---- probes (CudaProbe) ----
  const Plan& last_plan() const { return slots_[newest_].plan; }
  std::vector<int32_t> read_counters() const;
  std::string check_counter_totals() const;  // "" when every counter reached its plan's total
  void set_stuck_task(int task) { stuck_task_ = task; }
  void set_poison(bool on) { poison_ = on; }
  std::vector<float> time_last_step(int warmup, int reps, cudaStream_t stream);
  void enable_trace(int capacity_per_sm, cudaStream_t stream);
  std::vector<TraceRecord> read_trace(int64_t* dropped, cudaStream_t stream) const;

 private:
  // What one step in flight holds on the host.
  struct Slot {
    Plan plan;              // its plan (error messages name its tasks and counters)
    uint64_t lists_version = 0;  // plan's lists are StepPlanner::lists_version()'s (0: none, or changed here)
    PinnedBuffer staging;   // inputs, ring tables, token masks, task lists, launch ranges
    PinnedBuffer outputs;   // the error word, tokens [kMaxBatch], then logits when asked
    cudaEvent_t done = nullptr;
    int batch = 0;
    StepOutputTail tail;  // logits and logprobs, when asked
  };
  Plan& plan() { return slots_[newest_].plan; }
  void ensure_capacity(const Plan& plan);
  void upload(Slot& slot, std::span<const DecodeSeq> rows, const BatchState& batch, cudaStream_t stream,
              const int32_t* chain);
  void enqueue_kernel(cudaStream_t stream);
  void enqueue_outputs(Slot& slot, cudaStream_t stream, int32_t* chain);
  // Error when slot's error word reports one; newest: no step was launched after it (the counters
  // on the device are its own, so a timeout can name the earliest stuck wait).
  void check_error(const Slot& slot, bool newest) const;

  ModelConfig config_;
  MkModelWeights weights_;
  MegakernelOptions options_;
  prefill::KvCacheView kv_;  // the last step's pools (time_last_step replays it)
  std::unique_ptr<StepPlanner> planner_;
  Slot slots_[2];
  int newest_ = 0;  // the slot of the last step launched
  uint64_t n_launched_ = 0, n_finished_ = 0;
  double plan_s_ = 0.0, stage_s_ = 0.0;
  uint8_t* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  uint8_t* counters_ = nullptr;
  size_t counters_bytes_ = 0;
  Task* tasks_ = nullptr;
  size_t tasks_capacity_ = 0;
  uint64_t uploaded_lists_version_ = 0;  // the planner's lists on the device (0: none, or a slot's own)
  int32_t* ranges_ = nullptr;  // [n_waves + 1][2][n_sms]: per launch, begin and end of each SM's tasks
  size_t ranges_capacity_ = 0;
  MkError* error_ = nullptr;
  RowLogprobs* logprobs_ = nullptr;  // [kMaxBatch], allocated by the first step that asks
  cudaGraph_t graph_ = nullptr;            // cuda-ops: the step's waves
  cudaGraphExec_t graph_exec_ = nullptr;
  cudaGraphExec_t bench_exec_ = nullptr;   // cuda-mk step graph of time_last_step
  int stuck_task_ = -1;
  bool poison_ = false;
  bool token_masks_ = false;  // the step being run carries token masks (MkParams::token_masks)
  bool capture_routing_ = false;
  int32_t* route_ids_ = nullptr;  // [kMaxBatch][n_layers][top_k] (device)
  float* route_w_ = nullptr;
  TraceRecord* trace_ = nullptr;
  int32_t* trace_counts_ = nullptr;
  int trace_capacity_ = 0;
};

}  // namespace megadecode::cuda
