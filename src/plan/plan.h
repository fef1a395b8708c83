// The Plan of one decode step as the host holds it: the POD parts every executor uploads
// (PlanParams, the concatenated per-SM task lists, the attention items) plus host-only
// metadata the validator, the statistics and the emulator's end-of-step checks use (waves,
// counter totals and names, dynamic arrivals).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "plan/task.h"

namespace megadecode {

// One sequence of the step: its context length after the step (the new token sits at position
// n_ctx - 1) and its KV block table (logical block i -> physical block).
struct SeqState {
  int n_ctx = 1;
  std::span<const int32_t> block_table;
  // Models with sliding-window layers: the sequence's ring blocks (SeqChunk::ring_table), at least
  // min(R, blocks covering n_ctx) of them; empty otherwise.
  std::span<const int32_t> ring_table = {};
};

struct BatchState {
  int kv_block_size = 16;
  std::vector<SeqState> seqs;
};

// Options that are not scheduling policy: what the step must produce.
struct PlanOptions {
  int n_sms = 132;
  bool lm_head = true;  // FINAL_NORM + LM_HEAD (prefill steps that need no logits skip them)
  bool sample = true;   // SAMPLE (needs lm_head)
};

// A wave: all tasks of one op of one layer, dealt over the SMs. Lists are sorted by wave.
struct WaveInfo {
  Op op;
  int layer;
  int n_tasks;
  bool operator==(const WaveInfo&) const = default;
};

enum class CounterKind : uint8_t {
  kQkvDone, kAttnSplit, kAttnDone, kOprojDone, kRouterDone, kUpDone, kDownDone, kLmHeadDone, kSampleDone,
  kWaveDone, kUnused
};
const char* counter_kind_name(CounterKind kind);

struct CounterInfo {
  CounterKind kind = CounterKind::kUnused;
  int layer = -1;
  int index = 0;      // group, (seq * G + group) or wave
  int32_t total = 0;  // what arrives in one step (exact)
  bool operator==(const CounterInfo&) const = default;
};

// Arrivals made at run time rather than by a task's arrive list: the attention split counters
// and the merge's arrival, made by whichever of `tasks` finishes last. max_amount bounds what they
// add to the counter in all.
struct DynamicArrival {
  int32_t counter;
  int32_t max_amount;
  std::vector<int32_t> tasks;  // the tasks that may make it (indices into Plan::tasks)
  bool operator==(const DynamicArrival&) const = default;
};

struct Plan {
  PlanParams params{};
  std::string policy;
  std::vector<Task> tasks;           // SM s's list is tasks[list_begin[s], list_begin[s+1])
  std::vector<int32_t> list_begin;   // [n_sms + 1]
  std::vector<int32_t> task_wave;    // [tasks] index into waves
  std::vector<WaveInfo> waves;
  std::vector<AttnItem> attn_items;  // [n_attn_items], uploaded into buffers.attn_items
  std::vector<CounterInfo> counters;  // [n_counters]
  std::vector<DynamicArrival> dynamic_arrivals;

  int n_sms() const { return static_cast<int>(list_begin.size()) - 1; }
  int sm_of(int task) const;  // which list holds the task
};

std::string counter_name(const Plan& plan, int32_t counter);  // e.g. "qkv_done[L2,g1]"
std::string describe_task(const Plan& plan, int task);         // e.g. "task 57 (SM 3 #12: L2 o_proj rows 64..128)"

}  // namespace megadecode
