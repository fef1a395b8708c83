// MegakernelStep (see megakernel_step.h).
#include "cuda/backend/megakernel_step.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/stopwatch.h"
#include "cuda/common/kernels.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/graph_timing.h"
#include "cuda/megakernel/launch.h"
#include "plan/step_upload.h"

namespace megadecode::cuda {
namespace {

// Room for `need` elements, grown by half again: the arena follows the contexts (its block tables
// grow a block at a time), and cudaFree waits for the device, which would drain the overlapped
// loop's queue at every block boundary.
template <typename T>
void grow(T*& ptr, size_t& capacity, size_t need) {
  if (need <= capacity) return;
  CUDA_CHECK(cudaFree(ptr));
  ptr = nullptr;
  capacity = 0;
  const size_t grown = need + need / 2;
  CUDA_CHECK(cudaMalloc(&ptr, grown * sizeof(T)));
  capacity = grown;
}

}  // namespace

MegakernelStep::MegakernelStep(const ModelConfig& config, const MkModelWeights& weights, const Policy& policy,
                               const MegakernelOptions& options)
    : config_(config),
      weights_(weights),
      options_(options),
      planner_(std::make_unique<StepPlanner>(config, policy, PlanOptions{.n_sms = options.n_sms})) {
  CUDA_CHECK(cudaMalloc(&error_, sizeof(MkError)));
  for (Slot& slot : slots_) CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
}

MegakernelStep::~MegakernelStep() {
  if (bench_exec_) CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(bench_exec_));
  if (graph_exec_) CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(graph_exec_));
  if (graph_) CUDA_CHECK_NOTHROW(cudaGraphDestroy(graph_));
  CUDA_CHECK_NOTHROW(cudaFree(trace_));
  CUDA_CHECK_NOTHROW(cudaFree(trace_counts_));
  CUDA_CHECK_NOTHROW(cudaFree(arena_));
  CUDA_CHECK_NOTHROW(cudaFree(counters_));
  CUDA_CHECK_NOTHROW(cudaFree(tasks_));
  CUDA_CHECK_NOTHROW(cudaFree(ranges_));
  CUDA_CHECK_NOTHROW(cudaFree(error_));
  CUDA_CHECK_NOTHROW(cudaFree(logprobs_));
  for (Slot& slot : slots_) CUDA_CHECK_NOTHROW(cudaEventDestroy(slot.done));
  CUDA_CHECK_NOTHROW(cudaFree(route_ids_));
  CUDA_CHECK_NOTHROW(cudaFree(route_w_));
}

void MegakernelStep::launch(std::span<const DecodeSeq> rows, const BatchState& batch,
                            const prefill::KvCacheView& kv, cudaStream_t stream, int32_t* chain, bool want_logits,
                            bool want_logprobs) {
  MD_REQUIRE(batch.seqs.size() <= static_cast<size_t>(kMaxBatch) && batch.seqs.size() == rows.size(),
             "decode: batch of ", batch.seqs.size(), " sequences; the megakernel runs 1..", kMaxBatch);
  MD_CHECK(in_flight() < 2, "megakernel step: a third step launched before the first was finished");
  const Stopwatch planning;
  const int slot_index = static_cast<int>(n_launched_ % 2);
  Slot& slot = slots_[slot_index];
  kv_ = kv;
  const Plan& planned = planner_->plan(batch);  // make_plan's plan, patched from the last step's (microseconds)
  // The slot keeps its own copy (the step's errors name its tasks); the lists, megabytes at larger
  // batches, are copied only when they changed since the slot's last step.
  if (slot.lists_version != planner_->lists_version()) {
    slot.plan = planned;
    slot.lists_version = planner_->lists_version();
  } else {
    slot.plan.params = planned.params;
    slot.plan.attn_items = planned.attn_items;
  }
  ensure_capacity(slot.plan);
  if (stuck_task_ >= 0 && stuck_task_ < static_cast<int>(slot.plan.tasks.size()) &&
      slot.plan.tasks[stuck_task_].n_waits > 0) {
    slot.plan.tasks[stuck_task_].wait[0].target += 1;
    slot.lists_version = 0;  // not the planner's lists: copied and uploaded again next time
  }
  newest_ = slot_index;
  plan_s_ = planning.seconds();
  if (want_logprobs && logprobs_ == nullptr) CUDA_CHECK(cudaMalloc(&logprobs_, kMaxBatch * sizeof(RowLogprobs)));
  const Stopwatch staging;
  if (poison_) CUDA_CHECK(cudaMemsetAsync(arena_, 0xff, plan().params.buffers.total_bytes, stream));  // NaN
  upload(slot, rows, batch, stream, chain);
  stage_s_ = staging.seconds();
  enqueue_kernel(stream);
  slot.batch = static_cast<int>(rows.size());
  slot.tail = StepOutputTail{slot.batch, config_.vocab_size, want_logits, want_logprobs};
  enqueue_outputs(slot, stream, chain);
  ++n_launched_;
}

void MegakernelStep::finish(std::vector<int32_t>& tokens, std::vector<float>& logits,
                            std::vector<RowLogprobs>& logprobs) {
  MD_CHECK(in_flight() > 0, "megakernel step: finish() with no step in flight");
  const int slot_index = static_cast<int>(n_finished_ % 2);
  const Slot& slot = slots_[slot_index];
  ++n_finished_;  // whatever happens: the slot is free again
  CUDA_CHECK(cudaEventSynchronize(slot.done));
  check_error(slot, n_finished_ == n_launched_);
  const int32_t* out = reinterpret_cast<const int32_t*>(slot.outputs.as<uint8_t>() + sizeof(MkError));
  tokens.assign(out, out + slot.batch);
  slot.tail.unpack(reinterpret_cast<const uint8_t*>(out + kMaxBatch), logits, logprobs);
}

void MegakernelStep::ensure_capacity(const Plan& plan) {
  check_megakernel_shape(plan.params.shape);  // what the kernel assumes of the model and the batch
  check_megakernel_tasks(plan.tasks);         // and of the ops: none it would have to refuse on the device
  grow(arena_, arena_bytes_, plan.params.buffers.total_bytes);
  grow(counters_, counters_bytes_, static_cast<size_t>(plan.params.counters.n_counters) * kCounterStrideBytes);
  grow(tasks_, tasks_capacity_, plan.tasks.size());
  grow(ranges_, ranges_capacity_, (plan.waves.size() + 1) * 2 * static_cast<size_t>(options_.n_sms));
}

void MegakernelStep::upload(Slot& slot, std::span<const DecodeSeq> rows, const BatchState& batch,
                            cudaStream_t stream, const int32_t* chain) {
  const Plan& plan = slot.plan;
  const BufferLayout& b = plan.params.buffers;
  const size_t n = rows.size();
  std::vector<int32_t> tokens(n);
  std::vector<SamplingParams> sampling(n);
  std::vector<std::span<const uint32_t>> masks(n);
  BatchState tables = batch;  // the rows' whole tables (see launch)
  bool chained = false;
  for (size_t i = 0; i < n; ++i) {
    const DecodeSeq& r = rows[i];
    // The rows were checked (check_decode_rows): one token each, or none where chained.
    if (r.prev_row >= 0) {
      MD_REQUIRE(chain != nullptr, "decode: sequence ", i, " is chained to the previous step, and no chain buffer");
      tokens[i] = -1 - r.prev_row;  // pack_step_inputs: resolved on the device below
      chained = true;
    } else {
      tokens[i] = r.chunk.tokens[0];
    }
    sampling[i] = r.sampling;
    masks[i] = r.allowed;
    tables.seqs[i].block_table = r.chunk.block_table;
    tables.seqs[i].ring_table = r.chunk.ring_table;
  }
  // One pinned buffer a slot: the inputs laid out like the arena's first buffers, then the ring
  // tables and the token masks (placed after the step's buffers in the arena, each uploaded on its
  // own; the masks only in a step with a constrained row), the task lists and the launch ranges.
  // The device's task lists and launch ranges are the last ones uploaded: stream order keeps them
  // until the step before this one has run.
  const bool upload_lists = slot.lists_version == 0 || slot.lists_version != uploaded_lists_version_;
  const std::vector<int32_t> ranges = upload_lists ? launch_ranges(plan) : std::vector<int32_t>();
  const size_t need = step_inputs_bytes(plan);
  const size_t at_rings = need, at_masks = at_rings + b.ring_tables.bytes;
  const size_t at_tasks = (at_masks + b.token_masks.bytes + 63) / 64 * 64;
  const size_t at_ranges = at_tasks + plan.tasks.size() * sizeof(Task);
  uint8_t* staging = slot.staging.reserve(at_ranges + ranges.size() * sizeof(int32_t));
  pack_step_inputs(plan, tables, tokens, sampling, std::span(staging, need));
  CUDA_CHECK(cudaMemcpyAsync(arena_, staging, need, cudaMemcpyHostToDevice, stream));
  if (chained)
    resolve_chained_tokens(reinterpret_cast<int32_t*>(arena_ + b.token_ids.offset), static_cast<int>(n), chain,
                           stream);
  if (plan.params.shape.ring_len > 0) {
    pack_ring_tables(plan, tables, std::span(staging + at_rings, b.ring_tables.bytes));
    CUDA_CHECK(cudaMemcpyAsync(arena_ + b.ring_tables.offset, staging + at_rings, b.ring_tables.bytes,
                               cudaMemcpyHostToDevice, stream));
  }
  const size_t mask_bytes = pack_token_masks(plan, masks, std::span(staging + at_masks, b.token_masks.bytes));
  token_masks_ = mask_bytes > 0;
  if (token_masks_)
    CUDA_CHECK(cudaMemcpyAsync(arena_ + b.token_masks.offset, staging + at_masks, mask_bytes, cudaMemcpyHostToDevice,
                               stream));
  if (!upload_lists) return;
  std::memcpy(staging + at_tasks, plan.tasks.data(), plan.tasks.size() * sizeof(Task));
  CUDA_CHECK(cudaMemcpyAsync(tasks_, staging + at_tasks, plan.tasks.size() * sizeof(Task), cudaMemcpyHostToDevice,
                             stream));
  std::memcpy(staging + at_ranges, ranges.data(), ranges.size() * sizeof(int32_t));
  CUDA_CHECK(cudaMemcpyAsync(ranges_, staging + at_ranges, ranges.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                             stream));
  uploaded_lists_version_ = slot.lists_version;
}

void MegakernelStep::enqueue_outputs(Slot& slot, cudaStream_t stream, int32_t* chain) {
  const BufferLayout& b = plan().params.buffers;
  const size_t token_bytes = static_cast<size_t>(slot.batch) * sizeof(int32_t);
  const size_t at_tail = sizeof(MkError) + kMaxBatch * sizeof(int32_t);
  uint8_t* out = slot.outputs.reserve(at_tail + slot.tail.bytes());
  static_assert(sizeof(MkError) % 4 == 0);
  CUDA_CHECK(cudaMemcpyAsync(out, error_, sizeof(MkError), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaMemcpyAsync(out + sizeof(MkError), arena_ + b.out_tokens.offset, token_bytes, cudaMemcpyDeviceToHost,
                             stream));
  slot.tail.enqueue(out + at_tail, reinterpret_cast<const float*>(arena_ + b.logits.offset),
                    reinterpret_cast<const int32_t*>(arena_ + b.out_tokens.offset), logprobs_, stream);
  if (chain != nullptr)
    CUDA_CHECK(cudaMemcpyAsync(chain, arena_ + b.out_tokens.offset, token_bytes, cudaMemcpyDeviceToDevice, stream));
  CUDA_CHECK(cudaEventRecord(slot.done, stream));
}

void MegakernelStep::enqueue_kernel(cudaStream_t stream) {
  const int n_sms = options_.n_sms;
  const Plan& plan = this->plan();
  MkParams p{};
  p.plan = plan.params;
  p.tasks = tasks_;
  p.counters = counters_;
  p.arena = arena_;
  p.kv = kv_.data;
  const ModelConfig& c = config_;
  p.kv_layer_stride = static_cast<int64_t>(2) * kv_.n_blocks * c.n_kv_heads * kv_.block_size * c.head_dim;
  p.kv_v_offset = p.kv_layer_stride / 2;
  if (kv_.ring != nullptr) {
    p.kv_ring = kv_.ring;
    p.kv_ring_layer_stride = static_cast<int64_t>(2) * kv_.n_ring_blocks * c.n_kv_heads * kv_.block_size * c.head_dim;
    p.kv_ring_v_offset = p.kv_ring_layer_stride / 2;
  }
  p.w = weights_;
  p.error = error_;
  p.timeout_ns = options_.wait_timeout_ms * 1000000;
  p.flags = options_.kernel_flags;
  p.route_ids = capture_routing_ ? route_ids_ : nullptr;
  p.route_w = capture_routing_ ? route_w_ : nullptr;
  p.token_masks = token_masks_ ? 1 : 0;
  p.trace = trace_;
  p.trace_counts = trace_counts_;
  p.trace_capacity = trace_capacity_;
  const size_t trace_count_bytes = static_cast<size_t>(n_sms) * kTraceRoles * sizeof(int32_t);
  const size_t counter_bytes = static_cast<size_t>(plan.params.counters.n_counters) * kCounterStrideBytes;
  if (!options_.per_op) {
    CUDA_CHECK(cudaMemsetAsync(counters_, 0, counter_bytes, stream));
    CUDA_CHECK(cudaMemsetAsync(error_, 0, sizeof(MkError), stream));
    if (trace_) CUDA_CHECK(cudaMemsetAsync(trace_counts_, 0, trace_count_bytes, stream));
    p.list_begin = ranges_;
    p.list_end = ranges_ + n_sms;
    launch_megakernel(p, stream);
    return;
  }
  // cuda-ops: every wave is its own launch of the same kernel; captured, then replayed as a graph.
  (void)megakernel_shape(plan.params.shape.batch);  // one-time kernel configuration outside the capture
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CUDA_CHECK(cudaMemsetAsync(counters_, 0, counter_bytes, stream));
  CUDA_CHECK(cudaMemsetAsync(error_, 0, sizeof(MkError), stream));
  if (trace_) CUDA_CHECK(cudaMemsetAsync(trace_counts_, 0, trace_count_bytes, stream));
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    p.list_begin = ranges_ + (w + 1) * 2 * n_sms;
    p.list_end = p.list_begin + n_sms;
    launch_megakernel(p, stream);
  }
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  bool updated = false;
  if (graph_exec_) {
    cudaGraphExecUpdateResultInfo info{};
    updated = cudaGraphExecUpdate(graph_exec_, graph, &info) == cudaSuccess;
    if (!updated) {
      (void)cudaGetLastError();  // the failed update's error is an answer, not a fault
      CUDA_CHECK(cudaGraphExecDestroy(graph_exec_));
      graph_exec_ = nullptr;
    }
  }
  if (!updated) CUDA_CHECK(cudaGraphInstantiate(&graph_exec_, graph, 0));
  if (graph_) CUDA_CHECK(cudaGraphDestroy(graph_));
  graph_ = graph;
  CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream));
}

void MegakernelStep::check_error(const Slot& slot, bool newest) const {
  const MkError& e = *slot.outputs.as<MkError>();
  if (e.code == kMkOk) return;
  const Plan& step_plan = slot.plan;
  const std::string& name = options_.name;
  const std::string where = e.task >= 0 && e.task < static_cast<int>(step_plan.tasks.size())
                                ? describe_task(step_plan, e.task)
                                : cat("SM ", e.sm);
  switch (e.code) {
    case kMkWaitTimeout: {
      // The first SM to time out may be downstream of the real culprit: name the unsatisfied wait
      // of the earliest wave instead (every earlier wait was satisfied, so that one is stuck). The
      // counters are the step's own only when no step was launched after it.
      const std::vector<int32_t> v = newest ? read_counters() : std::vector<int32_t>();
      std::vector<std::pair<int, int>> order;  // (wave, task)
      for (size_t t = 0; t < step_plan.tasks.size(); ++t) order.push_back({step_plan.task_wave[t], static_cast<int>(t)});
      std::sort(order.begin(), order.end());
      for (const auto& [wave, t] : order) {
        const Task& task = step_plan.tasks[t];
        for (int i = 0; i < task.n_waits && !v.empty(); ++i)
          if (v[task.wait[i].counter] < task.wait[i].target)
            throw Error(cat(name, ": decode step abandoned: counter ", counter_name(step_plan, task.wait[i].counter),
                            " stuck at ", v[task.wait[i].counter], ", target ", task.wait[i].target, " (",
                            describe_task(step_plan, t), "; waited ", options_.wait_timeout_ms, " ms)"));
      }
      throw Error(cat(name, ": decode step abandoned: counter ", counter_name(step_plan, e.counter), " stuck at ",
                      e.value, ", target ", e.target, " (", where, ", waited ", options_.wait_timeout_ms, " ms)"));
    }
    case kMkBarrierTimeout:
      throw Error(cat(name, ": decode step abandoned: an in-SM handshake (", e.detail, ") timed out on SM ", e.sm));
    case kMkBadInput:
      throw Error(cat(name, ": decode step abandoned: an input out of range (value ", e.value, ", limit ", e.target,
                      ", detail ", e.detail, e.detail == -2 ? ": the router's top-k chose no expert, non-finite logits?" : "",
                      ") in ", where));
    case kMkBadShape:
      if (e.detail == kMkDetailUnknownOp)
        throw Error(cat(name, ": decode step abandoned: ",
                        e.value >= 0 && e.value < kNumOps ? op_name(static_cast<Op>(e.value)) : "an unknown op",
                        e.target != kNumOps ? cat(" with flags ", e.target) : std::string(),
                        " is not run by the megakernel (", where, ")"));
      throw Error(cat(name, ": decode step abandoned: the kernel cannot run this shape (", e.value, ", ", e.target,
                      ") in ", where));
    default:
      throw Error(cat(name, ": decode step abandoned: device error ", e.code, " in ", where));
  }
}

void MegakernelStep::read_logits(size_t first_row, std::span<float> out) const {
  const size_t V = static_cast<size_t>(config_.vocab_size);
  const Plan& plan = slots_[newest_].plan;
  MD_CHECK(in_flight() == 0 && out.size() % V == 0 && first_row + out.size() / V <= static_cast<size_t>(plan.params.shape.batch));
  CUDA_CHECK(cudaMemcpy(out.data(), arena_ + plan.params.buffers.logits.offset + first_row * V * sizeof(float),
                        out.size() * sizeof(float), cudaMemcpyDeviceToHost));
}

void MegakernelStep::set_routing_capture(bool on) {
  capture_routing_ = on;
  if (!on || route_ids_ != nullptr) return;
  const size_t n = static_cast<size_t>(kMaxBatch) * config_.n_layers * config_.n_experts_per_tok;
  CUDA_CHECK(cudaMalloc(&route_ids_, n * sizeof(int32_t)));
  CUDA_CHECK(cudaMalloc(&route_w_, n * sizeof(float)));
  // The megakernel writes no capture for a dense layer (read_routing records it as expert -1,
  // weight 0): defined bytes, so that copying them reads nothing uninitialised.
  CUDA_CHECK(cudaMemset(route_ids_, 0, n * sizeof(int32_t)));
  CUDA_CHECK(cudaMemset(route_w_, 0, n * sizeof(float)));
  CUDA_CHECK(cudaDeviceSynchronize());
}

void MegakernelStep::read_routing(int n_rows, std::vector<int32_t>& ids, std::vector<float>& w) const {
  const ModelConfig& c = config_;
  MD_CHECK(capture_routing_ && n_rows >= 0 && n_rows <= kMaxBatch);
  const size_t per = static_cast<size_t>(c.n_layers) * c.n_experts_per_tok;
  ids.resize(n_rows * per);
  w.resize(n_rows * per);
  CUDA_CHECK(cudaMemcpy(ids.data(), route_ids_, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(w.data(), route_w_, w.size() * sizeof(float), cudaMemcpyDeviceToHost));
  // A dense layer routes nothing: the capture holds whatever an earlier step left there. Recorded
  // as cpu-mk records it (expert -1, weight 0), so logs of repeated runs compare equal.
  for (int L = 0; L < c.n_layers; ++L) {
    if (c.is_moe_layer(L)) continue;
    for (int i = 0; i < n_rows; ++i)
      for (int k = 0; k < c.n_experts_per_tok; ++k) {
        const size_t at = i * per + static_cast<size_t>(L) * c.n_experts_per_tok + k;
        ids[at] = -1;
        w[at] = 0.0f;
      }
  }
}

// ---- probes ----

std::vector<int32_t> MegakernelStep::read_counters() const {
  const Plan& plan = slots_[newest_].plan;
  const int n = plan.params.counters.n_counters;
  std::vector<int32_t> raw(static_cast<size_t>(n) * kCounterStrideBytes / 4);
  CUDA_CHECK(cudaMemcpy(raw.data(), counters_, raw.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) out[i] = raw[static_cast<size_t>(i) * kCounterStrideBytes / 4];
  return out;
}

std::string MegakernelStep::check_counter_totals() const {
  const Plan& plan = slots_[newest_].plan;
  const std::vector<int32_t> v = read_counters();
  std::string bad;
  for (size_t i = 0; i < v.size(); ++i) {
    const CounterInfo& info = plan.counters[i];
    if (info.kind == CounterKind::kUnused) continue;
    const bool ok = v[i] == info.total;
    if (!ok && bad.size() < 2000)
      bad += cat(counter_name(plan, static_cast<int32_t>(i)), " = ", v[i], " (planned ", info.total, "); ");
  }
  return bad;
}

std::vector<float> MegakernelStep::time_last_step(int warmup, int reps, cudaStream_t stream) {
  MD_REQUIRE(!plan().tasks.empty() && in_flight() == 0, options_.name,
             ": time_last_step needs a decode step first, and none in flight");
  MD_REQUIRE(warmup >= 0 && reps >= 1, "time_last_step: warmup ", warmup, ", reps ", reps);
  cudaGraphExec_t exec = graph_exec_;
  if (!options_.per_op) {
    // The step's memsets + launch as one graph, captured for the current plan.
    if (bench_exec_) CUDA_CHECK(cudaGraphExecDestroy(bench_exec_));
    bench_exec_ = nullptr;
    (void)megakernel_shape(plan().params.shape.batch);  // kernel configuration outside the capture
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    enqueue_kernel(stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&bench_exec_, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    exec = bench_exec_;
  }
  MD_CHECK(exec != nullptr, "no step graph to replay");
  Slot& slot = slots_[newest_];
  return time_graph_replays(exec, warmup, reps, stream, [&] {  // throws naming the counter
    CUDA_CHECK(cudaMemcpy(slot.outputs.as<MkError>(), error_, sizeof(MkError), cudaMemcpyDeviceToHost));
    check_error(slot, true);
  });
}

void MegakernelStep::enable_trace(int capacity_per_sm, cudaStream_t stream) {
  MD_REQUIRE(capacity_per_sm >= 0, "trace capacity must be >= 0");
  CUDA_CHECK(cudaStreamSynchronize(stream));
  // Captured steps refer to the old trace buffers: drop them (the next decode() captures again).
  if (bench_exec_) CUDA_CHECK(cudaGraphExecDestroy(bench_exec_));
  if (graph_exec_) CUDA_CHECK(cudaGraphExecDestroy(graph_exec_));
  if (graph_) CUDA_CHECK(cudaGraphDestroy(graph_));
  bench_exec_ = nullptr;
  graph_exec_ = nullptr;
  graph_ = nullptr;
  MD_REQUIRE(in_flight() == 0, "enable_trace: a decode step is in flight");
  for (Slot& slot : slots_) {  // time_last_step needs a decode() with the new setting first
    slot.plan = Plan{};
    slot.lists_version = 0;
  }
  CUDA_CHECK(cudaFree(trace_));
  CUDA_CHECK(cudaFree(trace_counts_));
  trace_ = nullptr;
  trace_counts_ = nullptr;
  trace_capacity_ = capacity_per_sm;
  if (capacity_per_sm == 0) return;
  const size_t slots = static_cast<size_t>(options_.n_sms) * kTraceRoles;
  CUDA_CHECK(cudaMalloc(&trace_, slots * capacity_per_sm * sizeof(TraceRecord)));
  CUDA_CHECK(cudaMalloc(&trace_counts_, slots * sizeof(int32_t)));
  CUDA_CHECK(cudaMemset(trace_counts_, 0, slots * sizeof(int32_t)));
  CUDA_CHECK(cudaDeviceSynchronize());  // before the caller's stream (non-blocking) uses them
}

std::vector<TraceRecord> MegakernelStep::read_trace(int64_t* dropped, cudaStream_t stream) const {
  MD_REQUIRE(trace_ != nullptr, "read_trace: tracing is off (enable_trace first)");
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const size_t slots = static_cast<size_t>(options_.n_sms) * kTraceRoles;
  std::vector<int32_t> counts(slots);
  CUDA_CHECK(cudaMemcpy(counts.data(), trace_counts_, slots * sizeof(int32_t), cudaMemcpyDeviceToHost));
  std::vector<TraceRecord> all(slots * trace_capacity_);
  CUDA_CHECK(cudaMemcpy(all.data(), trace_, all.size() * sizeof(TraceRecord), cudaMemcpyDeviceToHost));
  std::vector<TraceRecord> out;
  int64_t lost = 0;
  for (size_t s = 0; s < slots; ++s) {
    const int n = std::min(counts[s], trace_capacity_);
    lost += counts[s] - n;
    out.insert(out.end(), all.begin() + static_cast<int64_t>(s) * trace_capacity_,
               all.begin() + static_cast<int64_t>(s) * trace_capacity_ + n);
  }
  if (dropped) *dropped = lost;
  return out;
}

}  // namespace megadecode::cuda
