// MegakernelStep (see megakernel_step.h).
#include "cuda/backend/megakernel_step.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/graph_timing.h"
#include "cuda/megakernel/launch.h"
#include "plan/step_upload.h"

namespace megadecode::cuda {
namespace {

template <typename T>
void grow(T*& ptr, size_t& capacity, size_t need) {
  if (need <= capacity) return;
  CUDA_CHECK(cudaFree(ptr));
  CUDA_CHECK(cudaMalloc(&ptr, need * sizeof(T)));
  capacity = need;
}

}  // namespace

MegakernelStep::MegakernelStep(const ModelConfig& config, const MkModelWeights& weights, const Policy& policy,
                               const MegakernelOptions& options)
    : config_(config),
      weights_(weights),
      options_(options),
      planner_(std::make_unique<StepPlanner>(config, policy, PlanOptions{.n_sms = options.n_sms})) {
  CUDA_CHECK(cudaMalloc(&error_, sizeof(MkError)));
  CUDA_CHECK(cudaMallocHost(&error_host_, sizeof(MkError)));
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
  CUDA_CHECK_NOTHROW(cudaFreeHost(error_host_));
  CUDA_CHECK_NOTHROW(cudaFreeHost(staging_));
  CUDA_CHECK_NOTHROW(cudaFree(route_ids_));
  CUDA_CHECK_NOTHROW(cudaFree(route_w_));
}

void MegakernelStep::run(std::span<const DecodeSeq> rows, const BatchState& batch, const prefill::KvCacheView& kv,
                         cudaStream_t stream) {
  MD_REQUIRE(batch.seqs.size() <= static_cast<size_t>(kMaxBatch), "decode: batch of ", batch.seqs.size(),
             " sequences; the megakernel runs 1..", kMaxBatch);
  kv_ = kv;
  plan_ = planner_->plan(batch);  // make_plan's plan, patched from the last step's (microseconds, not milliseconds)
  ensure_capacity(plan_);
  if (stuck_task_ >= 0 && stuck_task_ < static_cast<int>(plan_.tasks.size()) && plan_.tasks[stuck_task_].n_waits > 0)
    plan_.tasks[stuck_task_].wait[0].target += 1;
  if (poison_) CUDA_CHECK(cudaMemsetAsync(arena_, 0xff, plan_.params.buffers.total_bytes, stream));  // NaN
  upload(rows, batch, stream);
  launch(stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  check_error();
}

void MegakernelStep::ensure_capacity(const Plan& plan) {
  check_megakernel_shape(plan.params.shape);  // what the kernel assumes of the model and the batch
  check_megakernel_tasks(plan.tasks);         // and of the ops: none it would have to refuse on the device
  grow(arena_, arena_bytes_, plan.params.buffers.total_bytes);
  grow(counters_, counters_bytes_, static_cast<size_t>(plan.params.counters.n_counters) * kCounterStrideBytes);
  grow(tasks_, tasks_capacity_, plan.tasks.size());
  grow(ranges_, ranges_capacity_, (plan.waves.size() + 1) * 2 * static_cast<size_t>(options_.n_sms));
}

void MegakernelStep::upload(std::span<const DecodeSeq> rows, const BatchState& batch, cudaStream_t stream) {
  const BufferLayout& b = plan_.params.buffers;
  const size_t n = rows.size();
  std::vector<int32_t> tokens(n);
  std::vector<SamplingParams> sampling(n);
  std::vector<std::span<const uint32_t>> masks(n);
  BatchState tables = batch;  // the rows' whole tables (see run)
  for (size_t i = 0; i < n; ++i) {
    MD_REQUIRE(rows[i].prev_row < 0 && rows[i].chunk.tokens.size() == 1, "decode: sequence ", i,
               " has no token of its own (chained rows are decode_async's)");
    tokens[i] = rows[i].chunk.tokens[0];
    sampling[i] = rows[i].sampling;
    masks[i] = rows[i].allowed;
    tables.seqs[i].block_table = rows[i].chunk.block_table;
    tables.seqs[i].ring_table = rows[i].chunk.ring_table;
  }
  // Host inputs, packed into one pinned buffer laid out like the arena's first buffers; the ring
  // tables and the token masks (placed after the step's buffers in the arena) follow them in the
  // staging buffer, each uploaded on its own (the masks only in a step with a constrained row).
  const size_t need = step_inputs_bytes(plan_);
  const size_t total = need + b.ring_tables.bytes + b.token_masks.bytes;
  if (total > staging_bytes_) {
    CUDA_CHECK(cudaFreeHost(staging_));
    CUDA_CHECK(cudaMallocHost(&staging_, total));
    staging_bytes_ = total;
  }
  pack_step_inputs(plan_, tables, tokens, sampling, std::span(staging_, need));
  CUDA_CHECK(cudaMemcpyAsync(arena_, staging_, need, cudaMemcpyHostToDevice, stream));
  if (plan_.params.shape.ring_len > 0) {
    pack_ring_tables(plan_, tables, std::span(staging_ + need, b.ring_tables.bytes));
    CUDA_CHECK(cudaMemcpyAsync(arena_ + b.ring_tables.offset, staging_ + need, b.ring_tables.bytes,
                               cudaMemcpyHostToDevice, stream));
  }
  uint8_t* mask_staging = staging_ + need + b.ring_tables.bytes;
  const size_t mask_bytes = pack_token_masks(plan_, masks, std::span(mask_staging, b.token_masks.bytes));
  token_masks_ = mask_bytes > 0;
  if (token_masks_)
    CUDA_CHECK(
        cudaMemcpyAsync(arena_ + b.token_masks.offset, mask_staging, mask_bytes, cudaMemcpyHostToDevice, stream));
  if (uploaded_tasks_.size() != plan_.tasks.size() ||
      std::memcmp(uploaded_tasks_.data(), plan_.tasks.data(), plan_.tasks.size() * sizeof(Task)) != 0) {
    CUDA_CHECK(cudaMemcpyAsync(tasks_, plan_.tasks.data(), plan_.tasks.size() * sizeof(Task), cudaMemcpyHostToDevice,
                               stream));
    uploaded_tasks_ = plan_.tasks;
  }
  const std::vector<int32_t> ranges = launch_ranges(plan_);
  CUDA_CHECK(cudaMemcpyAsync(ranges_, ranges.data(), ranges.size() * 4, cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));  // pageable `ranges` must be consumed before it goes away
}

void MegakernelStep::launch(cudaStream_t stream) {
  const int n_sms = options_.n_sms;
  MkParams p{};
  p.plan = plan_.params;
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
  const size_t counter_bytes = static_cast<size_t>(plan_.params.counters.n_counters) * kCounterStrideBytes;
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
  (void)megakernel_shape(plan_.params.shape.batch);  // one-time kernel configuration outside the capture
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CUDA_CHECK(cudaMemsetAsync(counters_, 0, counter_bytes, stream));
  CUDA_CHECK(cudaMemsetAsync(error_, 0, sizeof(MkError), stream));
  if (trace_) CUDA_CHECK(cudaMemsetAsync(trace_counts_, 0, trace_count_bytes, stream));
  for (size_t w = 0; w < plan_.waves.size(); ++w) {
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

void MegakernelStep::check_error() {
  CUDA_CHECK(cudaMemcpy(error_host_, error_, sizeof(MkError), cudaMemcpyDeviceToHost));
  const MkError& e = *error_host_;
  if (e.code == kMkOk) return;
  const std::string& name = options_.name;
  const std::string where = e.task >= 0 && e.task < static_cast<int>(plan_.tasks.size())
                                ? describe_task(plan_, e.task)
                                : cat("SM ", e.sm);
  switch (e.code) {
    case kMkWaitTimeout: {
      // The first SM to time out may be downstream of the real culprit: name the unsatisfied wait
      // of the earliest wave instead (every earlier wait was satisfied, so that one is stuck).
      const std::vector<int32_t> v = read_counters();
      std::vector<std::pair<int, int>> order;  // (wave, task)
      for (size_t t = 0; t < plan_.tasks.size(); ++t) order.push_back({plan_.task_wave[t], static_cast<int>(t)});
      std::sort(order.begin(), order.end());
      for (const auto& [wave, t] : order) {
        const Task& task = plan_.tasks[t];
        for (int i = 0; i < task.n_waits; ++i)
          if (v[task.wait[i].counter] < task.wait[i].target)
            throw Error(cat(name, ": decode step abandoned: counter ", counter_name(plan_, task.wait[i].counter),
                            " stuck at ", v[task.wait[i].counter], ", target ", task.wait[i].target, " (",
                            describe_task(plan_, t), "; waited ", options_.wait_timeout_ms, " ms)"));
      }
      throw Error(cat(name, ": decode step abandoned: counter ", counter_name(plan_, e.counter), " stuck at ",
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

void MegakernelStep::read_tokens(std::span<int32_t> out) const {
  MD_CHECK(out.size() <= static_cast<size_t>(plan_.params.shape.batch));
  CUDA_CHECK(cudaMemcpy(out.data(), arena_ + plan_.params.buffers.out_tokens.offset, out.size() * 4,
                        cudaMemcpyDeviceToHost));
}

void MegakernelStep::read_logits(size_t first_row, std::span<float> out) const {
  const size_t V = static_cast<size_t>(config_.vocab_size);
  MD_CHECK(out.size() % V == 0 && first_row + out.size() / V <= static_cast<size_t>(plan_.params.shape.batch));
  CUDA_CHECK(cudaMemcpy(out.data(), arena_ + plan_.params.buffers.logits.offset + first_row * V * sizeof(float),
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
  const int n = plan_.params.counters.n_counters;
  std::vector<int32_t> raw(static_cast<size_t>(n) * kCounterStrideBytes / 4);
  CUDA_CHECK(cudaMemcpy(raw.data(), counters_, raw.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) out[i] = raw[static_cast<size_t>(i) * kCounterStrideBytes / 4];
  return out;
}

std::string MegakernelStep::check_counter_totals() const {
  const std::vector<int32_t> v = read_counters();
  std::string bad;
  for (size_t i = 0; i < v.size(); ++i) {
    const CounterInfo& info = plan_.counters[i];
    if (info.kind == CounterKind::kUnused) continue;
    const bool ok = v[i] == info.total;
    if (!ok && bad.size() < 2000)
      bad += cat(counter_name(plan_, static_cast<int32_t>(i)), " = ", v[i], " (planned ", info.total, "); ");
  }
  return bad;
}

std::vector<float> MegakernelStep::time_last_step(int warmup, int reps, cudaStream_t stream) {
  MD_REQUIRE(!plan_.tasks.empty(), options_.name, ": time_last_step needs a decode step first");
  MD_REQUIRE(warmup >= 0 && reps >= 1, "time_last_step: warmup ", warmup, ", reps ", reps);
  cudaGraphExec_t exec = graph_exec_;
  if (!options_.per_op) {
    // The step's memsets + launch as one graph, captured for the current plan.
    if (bench_exec_) CUDA_CHECK(cudaGraphExecDestroy(bench_exec_));
    bench_exec_ = nullptr;
    (void)megakernel_shape(plan_.params.shape.batch);  // kernel configuration outside the capture
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    launch(stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&bench_exec_, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    exec = bench_exec_;
  }
  MD_CHECK(exec != nullptr, "no step graph to replay");
  return time_graph_replays(exec, warmup, reps, stream, [&] { check_error(); });  // throws naming the counter
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
  plan_ = Plan{};  // time_last_step needs a decode() with the new setting first
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
