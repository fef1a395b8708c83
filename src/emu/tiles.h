// CPU tile implementations of every decode op, the bodies the cpu-mk emulator dispatches a Task
// to. Each computes exactly the outputs its task owns (row blocks, an attention item, an MoE share
// or tokens of one layer) in fp32 from the model's weights, reading and writing the step's buffers
// through the plan's BufferLayout, and synchronising only through `Sync` (the emulated counters).
// As on the GPU, every GEMM tile recomputes the RMSNorm of the residual it reads in its prologue,
// and every MoE share derives the layer's routing from the router logits itself (plan/moe_split.h).
// Reductions have a fixed order (ref::dot's lanes; attention splits 0..n-1; experts in top-k order),
// so results never depend on which thread ran what, or when. The math is the reference's
// (src/ref/math.h); only attention differs: its online softmax and split merge are the kernels'
// (cuda/common/attention_state.cuh, log2 domain). Everything else is bitwise the reference's.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/config.h"
#include "model/weights.h"
#include "plan/task.h"
#include "ref/kv_store.h"
#include "sampling/params.h"

namespace megadecode::emu {

// How a tile waits and arrives: implemented by the emulator's workers (std::atomic
// counters with acquire/release, bounded spins, injected delays).
class Sync {
 public:
  virtual ~Sync() = default;
  virtual void wait(int32_t counter, int32_t target) = 0;          // until counter >= target (acquire)
  virtual void arrive(int32_t counter, int32_t amount) = 0;        // release
  virtual int32_t fetch_add(int32_t counter, int32_t amount) = 0;  // acq_rel; returns the old value
  virtual void pause() = 0;                                        // an injected delay point
};

// Host sampler for SAMPLE: (sequence index in the batch, its logits [vocab]) -> token.
using HostSampler = std::function<int32_t(int seq, std::span<const float> logits)>;

// Small weights widened to fp32 once per emulator.
struct WidenedNorms {
  std::vector<std::vector<float>> input, post_attn, q, k;  // [n_layers][hidden or head_dim]
  std::vector<float> final_norm;                           // [hidden]
  std::vector<float> inv_freq;                             // [head_dim / 2] RoPE
  float attn_scale = 0;                                    // head_dim^-0.5
};
WidenedNorms widen_norms(const ModelConfig& config, const ModelWeights& weights);

// Everything a tile reads: model, KV storage and the step's buffers (pointers into the arena).
struct StepView {
  const ModelConfig* config = nullptr;
  const ModelWeights* weights = nullptr;
  const WidenedNorms* norms = nullptr;
  ref::KvStore* kv = nullptr;
  const PlanParams* params = nullptr;
  const HostSampler* sampler = nullptr;
  int32_t* route_experts = nullptr;  // [B, n_layers, K] when the step records its routing (host only)
  float* route_weights = nullptr;
#define MD_STEP_VIEW_FIELD(name, type, shape) type* name = nullptr;
  MD_BUFFERS(MD_STEP_VIEW_FIELD)
#undef MD_STEP_VIEW_FIELD

  const PlanShape& shape() const { return params->shape; }
  const CounterLayout& counters() const { return params->counters; }
  const AttnItem* items() const { return reinterpret_cast<const AttnItem*>(attn_items); }
  const SamplingParams* sampling_params() const { return reinterpret_cast<const SamplingParams*>(sampling); }
};

// One function per op, named after the op table (tile_<snake_name>).
#define MD_TILE_DECL(e, name, form) void tile_##name(const StepView& v, Sync& sync, const Task& task);
MD_OPS(MD_TILE_DECL)
#undef MD_TILE_DECL

// The FFN's normalised input, every token: RMSNorm(h) with post_attention_layernorm (sequential
// blocks), or of the layer input x with input_layernorm (parallel blocks; the embedding at layer 0).
std::vector<std::vector<float>> ffn_input(const StepView& v, int layer);

// Layer 0's residual, every token: the embedding rows of the batch's tokens [batch * hidden] (a
// parallel block's down shares add (x + o) + F to it; at later layers to x itself, in place).
std::vector<float> embedding(const StepView& v);

// RMSNorm of token t's row of an fp32 residual [batch, hidden] with `weight` (the tiles' prologue).
std::vector<float> normed_row(const StepView& v, const float* residual, int t, const std::vector<float>& weight);

}  // namespace megadecode::emu
