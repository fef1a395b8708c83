// The plain data a decode step runs on, shared by the host planner, the CPU emulator (cpu-mk) and
// the CUDA megakernel (cuda-mk): the Task record, the counter layout, the buffer layout and the
// attention items. Everything here is POD with static_asserted sizes; no std:: members.
//
// Execution model (what every executor must do, the GPU included):
//  - Grid = n_sms persistent workers. Worker s walks its own list of Task records in order.
//  - A task waits until counter[wait[i].counter] >= wait[i].target for every i (acquire), runs its
//    op on its tile, then adds arrive[j].amount to counter[arrive[j].counter] (release). Counters
//    are int32, each on its own 128-byte line (byte offset = index * CounterLayout::stride_bytes),
//    ZEROED BEFORE EACH LAUNCH (the GPU memsets them in the same graph; no counter is ever reset
//    inside a step), so every target is a static per-step count. Nothing is claimed from a queue:
//    every task, attention item and expert share is placed by the planner (or, for the experts'
//    units, by the one routing formula of plan/moe_split.h that every worker evaluates alike).
//  - ATTN tasks (one per attention item, built by the host each step from live lengths): the item
//    (seq, group, split) waits qkv_done[g], writes its split's partial, then fetch_add(acq_rel) on
//    attn_split[seq][g]; the LAST arriver (old value == n_splits - 1) merges the splits by
//    log-sum-exp in split order and arrives on attn_done. A one-split sequence is its own last
//    arriver, so every (seq, g) arrives exactly once.
//  - EXPERT_UP / EXPERT_DOWN: one task of each per worker per layer (share arg0 of arg1). The up
//    task derives the layer's routing from the router logits (plan/moe_split.h) and runs its share
//    of the up units (expert, 8 gate + 8 up columns); the down task its share of the down row
//    blocks over every active expert. Both arrive once, whatever their share holds, so up_done and
//    down_done reach n_sms.
//  - Buffers are reused from layer to layer: safe because every layer funnels (the next layer's QKV
//    tiles wait on every worker's EXPERT_DOWN, which transitively waits on all of the layer: in a
//    parallel block it waits on every up share and every O-proj tile, which waits on attention).
//
// Numerics (shared by every executor): RMSNorm is recomputed by each consumer tile from the fp32
// residual it reads (x before attention, h before the MoE, x after the last layer) in one fixed
// order, so every tile gets the same bits; the O-proj tile adds the residual (h = x + o); the down
// share adds h and the experts' outputs weighted in top-k order (x = h + sum_k w_k down_k).
// Parallel blocks (cohere2_moe) keep cpu-ref's order x = (x + o) + F: the O-proj tiles store
// o (fp32, unrounded) into o_out after the layer's attention, beside the FFN; the down shares (or
// dense down shares), which wait on every up share and every O-proj tile, compute F =
// sum_k w_k down_k (top-k order, from zero; dense: the MLP's output) and write
// x[t, r] = (x[t, r] + o_out[t, r]) + F in place (every reader of the layer's x, the QKV, router
// and up tasks, is done by then: the up shares and, through attention, the O-proj tiles wait on
// them). No other task writes x in that layer.
//
// Memory ordering on the GPU (DESIGN.md §5): producer = stores, block barrier, one thread
// red.release.gpu; consumer = one thread ld.acquire.gpu, then block barrier. The attention
// last-arriver uses atom.add.acq_rel.gpu. Activations, KV and counters written in the step are never
// read through the non-coherent path.
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

// One tile of one op. arg meaning per op (ranges are half-open [begin, end)):
//   QKV, O_PROJ, ROUTER, LM_HEAD: arg0..1 = 16-row block range of the op's weight matrix (QKV: the
//           fused matrix, group-major: group g = [q heads of g | k head g | v head g])
//   ATTN:   arg0 = attention item index
//   EXPERT_UP, EXPERT_DOWN, DENSE_UP, DENSE_DOWN: arg0 = this worker's share, arg1 = number of shares
//           (plan/moe_split.h; dense: the units and row blocks of the fixed MLP, no routing)
//   SAMPLE: arg0..1 = token range
struct Task {
  uint8_t op;         // Op
  uint8_t n_waits;    // <= kMaxWaits
  uint8_t n_arrives;  // <= kMaxArrives
  uint8_t flags;      // ATTN: kAttnSliding | kAttnNoRope; EXPERT_DOWN: kLastWaitAtWrite; 0 otherwise
  int16_t layer;      // -1 for ops after the last layer
  int16_t reserved;
  int32_t arg[4];
  Wait wait[kMaxWaits];
  Arrive arrive[kMaxArrives];
};
static_assert(sizeof(Task) == 64, "Task must stay one 64-byte record");

// ATTN task flags. kAttnSliding: the layer attends to the last PlanShape::sliding_window positions,
// its items are the sliding set (items [n_full_items, n_attn_items)) and its K/V live in the ring
// (ring_tables: position p in ring block (p / kv_block_size) mod ring_len, slot p mod
// kv_block_size). kAttnNoRope: no rotary embedding on q and k (cohere2_moe's full layers).
inline constexpr uint8_t kAttnSliding = 1;
inline constexpr uint8_t kAttnNoRope = 2;
// EXPERT_DOWN flag (parallel blocks): the task's last wait (every O-proj tile of its layer) is met
// before its first write of x (the combine x = (x + o) + F), not at its start: the fill and the
// jobs read only the up shares' activations and the weights, and run while the last O-proj tiles
// do (an O-proj tile follows its SM's up share, so the last one ends after the last up share).
inline constexpr uint8_t kLastWaitAtWrite = 4;

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

// An LM head tile's largest logit of one token row and its lowest token id (lm_best): the sampler's
// first pass, done by the tiles as they write the logits. id 0x7fffffff: no finite-or-inf logit
// (every one NaN).
struct LogitBest {
  float value;
  int32_t id;
};
static_assert(sizeof(LogitBest) == 8, "LogitBest must stay 8 bytes");

// Counter indices. Layer L's counters start at layer_base + L * layer_stride; the fields below are
// offsets inside a layer (arrays noted), then the global ones.
struct CounterLayout {
  int32_t n_counters;
  int32_t stride_bytes;  // kCounterStrideBytes
  int32_t layer_base;
  int32_t layer_stride;
  int32_t qkv_done;     // [n_kv_heads] QKV tiles of group g
  int32_t attn_split;   // [batch, n_kv_heads] splits of (seq, g) finished (last-arriver election)
  int32_t attn_done;    // (seq, g) merges finished
  int32_t oproj_done;   // O_PROJ tiles
  int32_t router_done;  // ROUTER tiles
  int32_t up_done;      // EXPERT_UP shares
  int32_t down_done;    // EXPERT_DOWN shares
  int32_t lm_head_done;  // global
  int32_t sample_done;
  int32_t wave_done;  // [n_waves] grid-sync policy only (else -1)
};

MD_HOST_DEVICE inline int32_t layer_counter(const CounterLayout& c, int layer, int32_t offset) {
  return c.layer_base + layer * c.layer_stride + offset;
}

// The step's device-visible buffers, one arena; offsets in bytes (256-aligned). Shapes use
// B = batch, H = hidden, G = KV groups, gs = q heads per group, D = head_dim, K = experts per
// token, I = moe_intermediate, V = vocab, A = attention items. The GPU stores bf16 where noted
// (in the first half of the fp32-sized buffer); the CPU emulator keeps everything fp32.
// X(name, element type, shape)
#define MD_BUFFERS(X)                                                                          \
  X(token_ids, int32_t, "[B] input token of each sequence (host-written)")                     \
  X(seq_len, int32_t, "[B] context length including the new token (host-written)")             \
  X(block_tables, int32_t, "[B, max_blocks_per_seq] physical KV block ids (host-written)")     \
  X(sampling, uint8_t, "[B] SamplingParams records (host-written)")                            \
  X(attn_items, uint8_t, "[A] AttnItem records (host-written)")                                \
  X(x, float, "[B, H] residual stream entering the layer (after the last layer: the final one)") \
  X(qkv, float, "[B, G, (gs+2)*D] raw q|k|v projections, group-major")                        \
  X(attn_part_o, float, "[A, gs, D] unnormalised partial outputs of attention splits")         \
  X(attn_part_ml, float, "[A, gs, 2] running max and sum of exp of each split")                \
  X(attn_out, float, "[B, n_heads*D] merged attention output (GPU: bf16)")                     \
  X(h, float, "[B, H] residual after attention, x + o (sequential blocks; 0 bytes otherwise)")   \
  X(router_logits, float, "[B, E]")                                                            \
  X(act, float, "[B*K, I] silu(gate)*up per (expert, token) slot, expert-major (GPU: bf16); dense layers [B, dense_inter]") \
  X(logits, float, "[B, V]")                                                                   \
  X(out_tokens, int32_t, "[B] sampled tokens")                                                 \
  X(ring_tables, int32_t, "[B, ring_len] ring blocks of the sliding layers (host-written; 0 bytes without)") \
  X(o_out, float, "[B, H] parallel blocks: the attention branch o, added by the down shares (0 bytes otherwise)") \
  X(shared_act, float, "[B, shared_inter] silu(gate)*up of the shared experts' MLP (0 bytes without)") \
  X(lm_best, uint8_t, "[n_lm_tasks, B] LogitBest of each LM head tile: its largest logit, lowest id first") \
  X(token_masks, uint32_t, "[B] int32 mask slot of each row (-1: any token), then [n_masked, ceil(V/32)] packed masks (host-written only in a step with a constrained row)")

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
  int32_t n_qkv_tasks;     // QKV tiles (n_qkv_tasks / n_kv_heads per group)
  int32_t n_oproj_tasks;
  int32_t n_router_tasks;
  int32_t n_lm_tasks;
  int32_t up_units;    // up units per expert: 16-row blocks of its packed up matrix (8 gate + 8 up rows)
  int32_t down_rbs;    // 16-row blocks of the hidden size (down shares split these)
  int32_t n_attn_items;
  int32_t lm_head;  // 1: LM_HEAD runs
  int32_t sample;   // 1: SAMPLE runs
  int32_t grid_sync;
  int32_t pad;
  // cohere2_moe (all 0 for qwen3_moe):
  int32_t parallel;        // 1: parallel blocks (op_table.h); the layer's residual is written by O-proj
  int32_t sliding_window;  // W of the sliding layers (ATTN flag kAttnSliding), 0: none
  int32_t ring_len;        // R = kv_ring_length(W, kv_block_size): ring table entries per sequence
  int32_t n_full_items;    // attention items [0, n_full_items) serve full layers, the rest sliding ones
  int32_t dense_inter;     // width of the dense FFN layers' MLP (0: no dense layer)
  int32_t dense_units;     // its up units (8 gate + 8 up rows each): dense_inter / 8
  int32_t router_after_attn;  // 1: ablation policy, router tiles wait for the layer's attention
  // Shared experts (parallel blocks, MoE layers): one SwiGLU MLP of width shared_inter on the FFN
  // input, its units after the routed ones in the EXPERT_UP shares (plan/moe_split.h), its down
  // rows added in the EXPERT_DOWN shares: F = routed + shared, or (routed + shared) / 2.
  int32_t shared_inter;    // 0: none
  int32_t shared_units;    // its up units (8 gate + 8 up rows each): shared_inter / 8
  int32_t shared_average;  // 1: F = (routed + shared) * 0.5
  float logit_scale;       // logits = lm_head(norm(x)) * logit_scale (1 for qwen3_moe)
};

struct PlanParams {
  PlanShape shape;
  CounterLayout counters;
  BufferLayout buffers;
};

}  // namespace megadecode
