// The one list of decode-step operations (qwen3_moe and cohere2_moe). The Op enum, the names, the CPU
// emulator's dispatch (src/emu/emulator.cpp: tile_<snake_name>) and the megakernel's (the consumers'
// op switch and megakernel_runs, src/cuda/megakernel: by form) are generated from MD_OPS; the timing
// model's table (src/plan/simulate_plan.cpp) is checked against it by a static_assert.
//
// X(Enum, snake_name, Form). Form = how a kernel runs the op: Gemm (weight tiles or shares through the
// GEMM path), Logits (the LM head: the GEMM path, and each tile's argmax for the sampler), Attn
// (attention items) or Sample (the sampler). Per layer the graph is (one counter hop
// per arrow, task.h):
//   QKV tiles (prologue: RMSNorm of the residual x) -> attention items (q/k norm, RoPE, K/V append,
//   split partial; the last split merges) -> O-proj tiles (epilogue: h = x + o) -> router tiles
//   (prologue: RMSNorm of h) -> expert up (every SM derives the layer's routing and its share of
//   the up units itself) -> expert down (its share of the row blocks over every active expert;
//   epilogue: x = h + sum_k w_k down_k in top-k order)
// then LM head tiles (prologue: the final RMSNorm) -> SAMPLE.
// cohere2_moe (parallel blocks, PlanShape::parallel): QKV tiles, router tiles and up shares all
// normalise the layer input x; attention items as above (sliding layers: the window, through the
// ring table); the O-proj tiles store the attention branch o into o_out beside the FFN; expert
// up/down (or, on a dense layer, DENSE_UP/DENSE_DOWN: the fixed SwiGLU MLP of width dense_inter in
// shares, no router) compute the FFN branch F, and the down shares, after every up share and every
// O-proj tile, write x = (x + o) + F. Waves per layer: QKV, ROUTER, ATTN, EXPERT_UP, O_PROJ,
// EXPERT_DOWN. No task runs on one SM alone for the whole GPU: the norms are recomputed in every
// consumer tile's prologue and the routing on every SM.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/host_device.h"

#define MD_OPS(X)                   \
  X(Qkv, qkv, Gemm)                 \
  X(Attn, attn, Attn)               \
  X(OProj, o_proj, Gemm)            \
  X(Router, router, Gemm)           \
  X(ExpertUp, expert_up, Gemm)      \
  X(ExpertDown, expert_down, Gemm)  \
  X(LmHead, lm_head, Logits)        \
  X(Sample, sample, Sample)         \
  X(DenseUp, dense_up, Gemm)        \
  X(DenseDown, dense_down, Gemm)

namespace megadecode {

enum class Op : uint8_t {
#define MD_OP_ENUM(e, name, form) k##e,
  MD_OPS(MD_OP_ENUM)
#undef MD_OP_ENUM
};

#define MD_OP_COUNT(e, name, form) +1
inline constexpr int kNumOps = 0 MD_OPS(MD_OP_COUNT);
#undef MD_OP_COUNT

inline constexpr const char* kOpNames[] = {
#define MD_OP_NAME(e, name, form) #name,
    MD_OPS(MD_OP_NAME)
#undef MD_OP_NAME
};

// How a kernel runs an op (MD_OPS' third column); kNone for a value that is no op.
enum class OpForm : uint8_t { kNone, kGemm, kAttn, kSample, kLogits };

MD_HOST_DEVICE constexpr OpForm op_form(Op op) {
  switch (op) {
#define MD_OP_FORM(e, name, form) \
  case Op::k##e:                  \
    return OpForm::k##form;
    MD_OPS(MD_OP_FORM)
#undef MD_OP_FORM
  }
  return OpForm::kNone;
}

inline constexpr const char* op_name(Op op) { return kOpNames[static_cast<int>(op)]; }

// The op named `name`, as an index; kNumOps when no op has that name.
inline constexpr int op_index(std::string_view name) {
  int i = 0;
  while (i < kNumOps && name != kOpNames[i]) ++i;
  return i;
}

// Expert work: its weight pages are known only once the layer's routing is.
inline constexpr bool op_is_routed(Op op) { return op == Op::kExpertUp || op == Op::kExpertDown; }

// Work cut in one share per SM (arg0 = share, arg1 = shares): the routed experts and the dense FFN.
inline constexpr bool op_is_share(Op op) { return op_is_routed(op) || op == Op::kDenseUp || op == Op::kDenseDown; }

}  // namespace megadecode
