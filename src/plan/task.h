// The plain data a decode step runs on, shared by the host planner, the CPU emulator (cpu-mk) and
// the CUDA megakernel (cuda-mk): the Task record, the counter layout, the buffer layout and the
// attention/MoE work items. Everything here is POD with static_asserted sizes; no std:: members.
//
// Execution model (what every executor must do, the GPU included):
//  - Grid = n_sms persistent workers. Worker s walks its own list of Task records in order.
//  - A task first waits until counter[wait[i].counter] >= wait[i].target for every i (acquire),
//    then runs its op on its tile, then adds arrive[j].amount to counter[arrive[j].counter]
//    (release) for every j. Counters are int32, each on its own 128-byte line
//    (byte offset = index * CounterLayout::stride_bytes), ZEROED BEFORE EACH LAUNCH (the GPU
//    memsets them in the same graph; no counter is ever reset inside a step), so every target
//    is a static per-step count.
//  - Drain ops (op_is_drain) claim items from a queue with one fetch_add on the queue's head
//    counter until the claimed index >= the queue's item count; each item has its own waits and
//    arrivals computed from CounterLayout (below), then the drain task arrives like any task.
//      ATTN queue (per layer one head; items shared by all layers, built by the host each step
//        from live lengths): item (seq, group, split) waits qkv_done[g] >= qkv_tiles_per_group,
//        writes its partial, then fetch_add(acq_rel) on attn_split[seq][g]; the LAST arriver
//        (old value == n_splits - 1) merges the splits by log-sum-exp in split order and arrives
//        on attn_done[g]. A one-split sequence is its own last arriver, so it always arrives.
//      EXPERT_UP / EXPERT_DOWN queues (per layer; items written by DISPATCH, count in
//        moe_n_items[layer]): up item (e, column block) arrives up_done[e]; down item
//        (e, row block) waits up_done[e] >= up_blocks and arrives down_done.
//  - Targets never depend on run-time data: DISPATCH credits the counters on behalf of what the
//    routing did not produce (up_done[e] += up_blocks for every inactive expert, down_done +=
//    (n_experts - n_active) * down_blocks), so down_done's target is always
//    n_experts * down_blocks. After a step every counter equals its planned total (the emulator
//    checks this; over-arrival is an error).
//  - Buffers are reused from layer to layer: this is safe because every layer funnels (MOE_NORM
//    waits on all O-proj tiles, ROUTER on all norms, DISPATCH on all router tiles, the next
//    ATTN_NORM on all down items), so all of layer L finishes before layer L+1 writes.
//
// Memory ordering on the GPU (DESIGN.md §5): producer = stores, block barrier, one thread
// fence.acq_rel.gpu + red.relaxed.gpu.add; consumer = one thread polls ld.acquire.gpu (or relaxed
// + fence.acquire.gpu), then block barrier. The attention last-arriver uses atom.add.acq_rel.gpu.
// Activations, routing tables, queues and KV written in the step are never read via ld.global.nc.
#pragma once

#include <cstdint>

#include "core/bf16.h"  // MD_HOST_DEVICE
#include "plan/op_table.h"

namespace megadecode {

inline constexpr int kMaxWaits = 3;
inline constexpr int kMaxArrives = 2;
inline constexpr int kCounterStrideBytes = 128;

struct Wait {
  int32_t counter;
  int32_t target;  // >= 1
};

struct Arrive {
  int32_t counter;
  int32_t amount;  // >= 1
};

// One tile of one op. arg meaning per op (rows/tokens are half-open ranges [begin, end)):
//   ATTN_NORM, MOE_NORM, FINAL_NORM, SAMPLE: arg0..1 = token range
//   QKV:    arg0 = KV group, arg1..2 = row range inside the group's fused rows
//           (q heads g*gs..g*gs+gs-1, then k head g, then v head g; (gs+2)*head_dim rows)
//   O_PROJ: arg0 = KV group (K slice = that group's q heads), arg1..2 = output row range
//   ROUTER: arg0..1 = expert range          LM_HEAD: arg0..1 = vocab row range
//   DISPATCH, ATTN, EXPERT_UP, EXPERT_DOWN: no args (queues and counters from PlanParams)
struct Task {
  uint8_t op;         // Op
  uint8_t n_waits;    // <= kMaxWaits
  uint8_t n_arrives;  // <= kMaxArrives
  uint8_t flags;      // reserved, 0
  int16_t layer;      // -1 for ops after the last layer
  int16_t reserved;
  int32_t arg[4];
  Wait wait[kMaxWaits];
  Arrive arrive[kMaxArrives];
};
static_assert(sizeof(Task) == 64, "Task must stay one 64-byte record");

// One attention work item: query heads of KV group `group` of sequence `seq` against key
// positions [pos_begin, pos_end). Items of one (seq, group) have split = 0..n_splits-1 and write
// partials part_base + split. The item with pos_end == seq_len also appends the new token's K/V.
struct AttnItem {
  int32_t seq;
  int32_t group;
  int32_t split;
  int32_t n_splits;
  int32_t pos_begin;
  int32_t pos_end;
  int32_t part_base;
  int32_t reserved;
};
static_assert(sizeof(AttnItem) == 32, "AttnItem must stay 32 bytes");

// MoE items (written by DISPATCH): expert in the high 16 bits, block in the low 16.
inline constexpr int32_t pack_moe_item(int32_t expert, int32_t block) { return (expert << 16) | block; }
inline constexpr int32_t moe_item_expert(int32_t item) { return item >> 16; }
inline constexpr int32_t moe_item_block(int32_t item) { return item & 0xffff; }

// Counter indices. Layer L's counters start at layer_base + L * layer_stride; the fields below are
// offsets inside a layer (arrays noted), then the global ones.
struct CounterLayout {
  int32_t n_counters;
  int32_t stride_bytes;  // kCounterStrideBytes
  int32_t layer_base;
  int32_t layer_stride;
  int32_t norm_done;      // ATTN_NORM tasks
  int32_t qkv_done;       // [n_kv_heads] QKV tiles of group g
  int32_t attn_split;     // [batch, n_kv_heads] splits of (seq, g) finished (last-arriver election)
  int32_t attn_done;      // [n_kv_heads] (seq, g) merges finished
  int32_t oproj_done;     // O_PROJ tiles
  int32_t moe_norm_done;  // MOE_NORM tasks
  int32_t router_done;    // ROUTER tiles
  int32_t dispatch_done;  // DISPATCH (1)
  int32_t up_done;        // [n_experts] up items of expert e (+ credit when inactive)
  int32_t down_done;      // down items (+ credit for inactive experts)
  int32_t attn_head;      // queue heads (fetch_add claims)
  int32_t up_head;
  int32_t down_head;
  int32_t final_norm_done;  // global
  int32_t lm_head_done;
  int32_t sample_done;
  int32_t wave_done;  // [n_waves] grid-sync policy only (else -1)
};

MD_HOST_DEVICE inline int32_t layer_counter(const CounterLayout& c, int layer, int32_t offset) {
  return c.layer_base + layer * c.layer_stride + offset;
}

// The step's device-visible buffers, one arena; offsets in bytes (256-aligned). Shapes use
// B = batch, H = hidden, G = KV groups, gs = q heads per group, D = head_dim, E = experts,
// K = experts per token, I = moe_intermediate, V = vocab, A = attention item capacity.
// X(name, element type, shape)
#define MD_BUFFERS(X)                                                                          \
  X(token_ids, int32_t, "[B] input token of each sequence (host-written)")                     \
  X(seq_len, int32_t, "[B] context length including the new token (host-written)")             \
  X(block_tables, int32_t, "[B, max_blocks_per_seq] physical KV block ids (host-written)")     \
  X(sampling, uint8_t, "[B] SamplingParams records (host-written)")                            \
  X(attn_items, uint8_t, "[A] AttnItem records (host-written)")                                \
  X(x, float, "[B, H] residual stream entering the layer")                                     \
  X(xn, float, "[B, H] input_layernorm(x)")                                                    \
  X(qkv, float, "[B, G, (gs+2)*D] raw q|k|v projections, group-major")                        \
  X(attn_part_o, float, "[A, gs, D] unnormalised partial outputs of attention splits")         \
  X(attn_part_ml, float, "[A, gs, 2] running max and sum of exp of each split")                \
  X(attn_out, float, "[B, n_heads*D] merged attention output")                                 \
  X(o_part, float, "[G, B, H] O-proj partial sums, one per KV group")                          \
  X(h, float, "[B, H] residual after attention")                                               \
  X(hn, float, "[B, H] post_attention_layernorm(h)")                                           \
  X(router_logits, float, "[B, E]")                                                            \
  X(topk_ids, int32_t, "[B, K] chosen experts, descending probability")                        \
  X(topk_w, float, "[B, K] their routing weights")                                             \
  X(token_slot, int32_t, "[B, K] row of (token, k) in act/down_out")                           \
  X(expert_count, int32_t, "[E] tokens routed to each expert")                                 \
  X(expert_offset, int32_t, "[E+1] prefix sum of expert_count")                                \
  X(expert_tokens, int32_t, "[B*K] token of each slot, expert-major then token order")         \
  X(up_items, int32_t, "[up capacity] packed (expert, column block)")                          \
  X(down_items, int32_t, "[down capacity] packed (expert, row block)")                         \
  X(moe_n_items, int32_t, "[n_layers, 2] up/down item counts written by DISPATCH")             \
  X(act, float, "[B*K, I] silu(gate)*up per slot")                                             \
  X(down_out, float, "[B*K, H] expert output per slot")                                        \
  X(xf, float, "[B, H] final norm output")                                                     \
  X(logits, float, "[B, V]")                                                                   \
  X(out_tokens, int32_t, "[B] sampled tokens")

struct BufferSpan {
  uint64_t offset;  // bytes from the arena start
  uint64_t bytes;
};

struct BufferLayout {
#define MD_BUFFER_FIELD(name, type, shape) BufferSpan name;
  MD_BUFFERS(MD_BUFFER_FIELD)
#undef MD_BUFFER_FIELD
  uint64_t total_bytes;
};

// Shapes and tilings every executor needs besides the task lists.
struct PlanShape {
  int32_t batch;
  int32_t n_sms;
  int32_t n_layers;
  int32_t hidden;
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t head_dim;
  int32_t group_size;  // q heads per KV head
  int32_t n_experts;
  int32_t top_k;
  int32_t moe_inter;
  int32_t vocab;
  int32_t kv_block_size;
  int32_t max_blocks_per_seq;
  int32_t qkv_group_rows;  // (group_size + 2) * head_dim
  int32_t qkv_rows;        // rows per QKV tile
  int32_t qkv_tiles_per_group;
  int32_t o_rows;  // output rows per O_PROJ tile
  int32_t o_row_blocks;
  int32_t router_rows;
  int32_t router_tiles;
  int32_t up_cols;  // intermediate columns per up item (gate and up rows)
  int32_t up_blocks;
  int32_t down_rows;  // hidden rows per down item
  int32_t down_blocks;
  int32_t lm_rows;
  int32_t lm_tiles;
  int32_t norm_tokens;  // tokens per norm task
  int32_t n_norm_tasks;
  int32_t attn_capacity;  // A
  int32_t n_attn_items;
  int32_t up_capacity;
  int32_t down_capacity;
  int32_t lm_head;  // 1: FINAL_NORM and LM_HEAD run
  int32_t sample;   // 1: SAMPLE runs
  int32_t grid_sync;
};

struct PlanParams {
  PlanShape shape;
  CounterLayout counters;
  BufferLayout buffers;
};

}  // namespace megadecode
