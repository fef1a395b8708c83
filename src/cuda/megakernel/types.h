// Plain data shared by the megakernel (device) and its host side: the device weight view, the
// kernel parameters, the device error record and the error codes. POD only, sizes asserted.
#pragma once

#include <cstdint>

#include "plan/gemm_geometry.h"
#include "cuda/megakernel/flags.h"
#include "cuda/megakernel/trace.h"
#include "plan/task.h"

namespace megadecode::cuda {

// Weights of one layer in device memory. "packed" = the skinny GEMM's fragment-major layout
// (cuda/common/weight_pack.cuh), all bf16.
struct MkLayerWeights {
  const uint16_t* qkv;         // packed [G*(gs+2)*D rows, H]: group g = [q heads of g | k head g | v head g]
  const uint16_t* o_proj;      // packed [H rows, n_heads*D]
  const uint16_t* router;      // packed [E rows, H]
  const uint16_t* experts_up;  // E x packed [2*I rows, H]: row block j = gate rows 8j..8j+7, up rows 8j..8j+7
  const uint16_t* experts_down;  // E x packed [H rows, I]
  const uint16_t* input_norm;    // [H]
  const uint16_t* post_norm;     // [H]
  const uint16_t* q_norm;        // [D]; nullptr: the model has no q/k norms (attention uses q, k as projected)
  const uint16_t* k_norm;        // [D]; nullptr with q_norm
  // Dense FFN layers (parallel blocks; nullptr on MoE layers): the MLP packed like one expert's.
  const uint16_t* dense_up;      // packed [2*dense_inter rows, H]: row block j = gate rows 8j..8j+7, up rows 8j..8j+7
  const uint16_t* dense_down;    // packed [H rows, dense_inter]
  int64_t expert_up_elems;       // packed elements of one expert's up matrix (stride between experts)
  int64_t expert_down_elems;
  int32_t kv_ring_index;         // a sliding-window layer: its index among the ring pool's layers; -1 otherwise
  int32_t kv_full_index;         // a full-attention layer: its index among the full pool's layers; -1 otherwise
};

struct MkModelWeights {
  const uint16_t* embed;       // [V, H] row-major (lookup)
  const uint16_t* final_norm;  // [H]
  const uint16_t* lm_head;     // packed [V rows, H]
  const float2* rope;            // [rope_positions][D/2] (cos, sin) of float(pos) * inv_freq[i], from the host
  const MkLayerWeights* layers;  // [n_layers] (device array)
  float rms_eps;
  float attn_scale;  // 1/sqrt(D)
  int32_t norm_topk;
  int32_t rope_positions;  // positions the RoPE table covers (the model's max_position_embeddings)
  int32_t router_sigmoid;  // 1: sigmoid routing (RouterKind::kSigmoidTopK), 0: softmax
  int32_t rope_interleaved;  // 1: RoPE rotates adjacent pairs (RopeStyle::kInterleaved), 0: NeoX halves
};

// The first failure of a step (first writer wins); all zero when the step succeeded.
enum MkErrorCode : int32_t {
  kMkOk = 0,
  kMkWaitTimeout = 1,    // a counter did not reach its target in time
  kMkBarrierTimeout = 2, // an in-CTA handshake (a page, the routing) did not complete in time
  kMkBadInput = 3,       // a token, attention item or routing outside its range (e.g. NaN logits)
  kMkBadShape = 4,       // the kernel was launched with a shape it cannot run
};

// MkError::detail of a kMkBadShape that names a task whose op the kernel does not run (value = the
// op): both the consumers and the loader stop there, so neither walks a page sequence the other
// does not.
constexpr int32_t kMkDetailUnknownOp = -3;

// The ops the megakernel runs: every op of MD_OPS, by its form (op_form, plan/op_table.h). The
// consumers' op switch, the loader's walk and the host's plan check (check_megakernel_tasks) all ask
// this; an op outside it stops the step instead of running as some other op.
MD_HOST_DEVICE constexpr bool megakernel_runs(Op op) { return op_form(op) != OpForm::kNone; }

constexpr bool megakernel_runs_every_op() {
  for (int i = 0; i < kNumOps; ++i)
    if (!megakernel_runs(static_cast<Op>(i))) return false;
  return !megakernel_runs(static_cast<Op>(kNumOps));
}
static_assert(megakernel_runs_every_op(), "the megakernel runs exactly the ops of MD_OPS (plan/op_table.h)");

struct MkError {
  int32_t code;
  int32_t counter;  // counter index (wait timeouts), else -1
  int32_t value;    // its value when given up
  int32_t target;
  int32_t sm;
  int32_t task;     // index into the plan's task array, -1 when not a task
  int32_t detail;   // what was waited for, or the bad value's index
  int32_t pad;
};
static_assert(sizeof(MkError) == 32);

// Kernel parameters (passed by value, < 4 KB).
struct MkParams {
  PlanParams plan;
  const Task* tasks;              // all lists concatenated
  const int32_t* list_begin;      // [n_sms] first task of SM s in this launch
  const int32_t* list_end;        // [n_sms] one past its last task in this launch
  uint8_t* counters;              // n_counters * stride_bytes, zeroed before the step
  uint8_t* arena;                 // the BufferLayout arena
  uint16_t* kv;                   // [n_full_layers][2][n_blocks][G][block_size][D] bf16, layer L at its kv_full_index
  int64_t kv_layer_stride;        // elements per layer (both K and V)
  int64_t kv_v_offset;            // elements from K to V of one layer
  // The ring pool of the sliding-window layers (ATTN kAttnSliding; nullptr for a model without):
  // [n_ring_layers][2][n_ring_blocks][G][block_size][D] bf16, layer L at its kv_ring_index.
  uint16_t* kv_ring;
  int64_t kv_ring_layer_stride;   // elements per ring layer (both K and V)
  int64_t kv_ring_v_offset;       // elements from K to V of one ring layer
  MkModelWeights w;
  // Page and window geometry of every GEMM kind (plan/gemm_geometry.h), for this batch and kernel instantiation:
  // filled by launch_megakernel, whatever the caller put here.
  GemmGeo geo[kNumGemmKinds];
  MkError* error;
  int64_t timeout_ns;             // bound on any single wait
  // Routing capture (tests; nullptr when off): [batch][n_layers][top_k] chosen experts and weights,
  // written by SM 0's expert-up share.
  int32_t* route_ids;
  float* route_w;
  // 1: the step carries token masks (a constrained row, structured output): SAMPLE reads each row's
  // slot in the token_masks buffer and samples a constrained row under its mask. 0: SAMPLE reads
  // nothing of that buffer (an unconstrained step costs no extra global read).
  int32_t token_masks;
  // ---- benchmark switches and trace (trace.h); zero/null in production ----
  uint32_t flags;                 // MkFlag bits
  int32_t trace_capacity;         // records per SM per role
  TraceRecord* trace;             // [n_sms][kTraceRoles][trace_capacity], nullptr: no trace
  int32_t* trace_counts;          // [n_sms][kTraceRoles], zeroed before the launch
};
static_assert(sizeof(MkParams) <= 4096, "the kernel's parameters must stay within 4 KB");

}  // namespace megadecode::cuda
