// The one list of decode-step operations (qwen3_moe). Everything that needs the set of ops — the
// Op enum, the names, the CPU emulator's dispatch (src/emu/emulator.cpp) and the device dispatch
// (src/cuda) — is generated from MD_OPS, so nothing is kept in sync by hand.
//
// X(Enum, snake_name, is_drain): a drain op appears as one task per SM in its wave and claims
// items from a queue (attention: built by the host; MoE: built on the device by DISPATCH).
// Per layer the chain is: ATTN_NORM → QKV → ATTN → O_PROJ → MOE_NORM → ROUTER → DISPATCH →
// EXPERT_UP → EXPERT_DOWN, then FINAL_NORM → LM_HEAD → SAMPLE. The MoE combine (Σ_k w_k·down_k,
// fixed k order, + residual) is the prologue of the next ATTN_NORM / FINAL_NORM and the O-proj
// reduction (Σ over KV groups, fixed order, + residual) the prologue of MOE_NORM: this saves a
// dependent hop per layer (see task.h).
#pragma once

#include <cstdint>

#define MD_OPS(X)                 \
  X(AttnNorm, attn_norm, false)   \
  X(Qkv, qkv, false)              \
  X(Attn, attn, true)             \
  X(OProj, o_proj, false)         \
  X(MoeNorm, moe_norm, false)     \
  X(Router, router, false)        \
  X(Dispatch, dispatch, false)    \
  X(ExpertUp, expert_up, true)    \
  X(ExpertDown, expert_down, true) \
  X(FinalNorm, final_norm, false) \
  X(LmHead, lm_head, false)       \
  X(Sample, sample, false)

namespace megadecode {

enum class Op : uint8_t {
#define MD_OP_ENUM(e, name, drain) k##e,
  MD_OPS(MD_OP_ENUM)
#undef MD_OP_ENUM
};

#define MD_OP_COUNT(e, name, drain) +1
inline constexpr int kNumOps = 0 MD_OPS(MD_OP_COUNT);
#undef MD_OP_COUNT

inline constexpr const char* kOpNames[] = {
#define MD_OP_NAME(e, name, drain) #name,
    MD_OPS(MD_OP_NAME)
#undef MD_OP_NAME
};

inline constexpr bool kOpIsDrain[] = {
#define MD_OP_DRAIN(e, name, drain) drain,
    MD_OPS(MD_OP_DRAIN)
#undef MD_OP_DRAIN
};

inline constexpr const char* op_name(Op op) { return kOpNames[static_cast<int>(op)]; }
inline constexpr bool op_is_drain(Op op) { return kOpIsDrain[static_cast<int>(op)]; }

}  // namespace megadecode
