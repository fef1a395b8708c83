// The CPU emulator of the megakernel (backend `cpu-mk`): runs a Plan exactly as the GPU does —
// one thread per emulated SM walking its task list, std::atomic counters (acquire on waits,
// release on arrivals, acq_rel for the attention last-arriver's fetch_add) — with seeded random
// delays injected around tasks and the attention items' arrivals, so any missing
// dependency shows up as a different result (or a ThreadSanitizer report). The math is fp32 over
// the same buffer layout the GPU uses (src/emu/tiles.h).
//
// Sequential mode runs the plan on one thread, wave by wave (in each wave, SM 0's tasks, then
// SM 1's, ...): the canonical interleaving multi-threaded runs must match bitwise. It also
// re-poisons each layer's buffers before the layer writes them, so that a row no tile of a later
// layer computes shows as NaN rather than as the previous layer's value.
//
// Every wait is bounded: a wait longer than the timeout ends the step with an Error naming the SM,
// the task (and item), the counter, its value and its target. After a step every counter must
// equal its planned total (over- or under-arrival is an Error).
// Threading: one caller at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "emu/tiles.h"
#include "model/config.h"
#include "model/weights.h"
#include "plan/plan.h"
#include "ref/kv_store.h"
#include "sampling/params.h"

namespace megadecode::emu {

struct EmulatorOptions {
  bool sequential = false;         // one thread, wave order
  uint64_t delay_seed = 0;         // seeds the injected delays (per SM)
  double delay_probability = 0.0;  // chance of a delay at each delay point
  int max_delay_us = 40;           // a delay is a yield or a sleep of up to this
  double timeout_s = 60.0;         // longest wait before the step fails
  bool poison = true;              // NaN-fill activations (-1 for tables) before the step (and, sequential,
                                   // before each layer rewrites them)
};

// The step's inputs besides the plan: one entry per sequence of the BatchState it was planned for.
struct StepInput {
  std::span<const int32_t> tokens;
  const BatchState* batch = nullptr;
  std::span<const SamplingParams> sampling;  // empty: defaults
  HostSampler sampler;                       // needed when the plan samples
  bool record_routing = false;               // fill StepOutput's routing (routing-exact tests)
};

struct StepOutput {
  std::vector<float> logits;    // [batch, vocab] when the plan has the LM head
  std::vector<int32_t> tokens;  // [batch] when the plan samples
  // With StepInput::record_routing: [batch, n_layers, top_k] the experts each row's MoE layers
  // used, in top-k order, and their weights, as the down shares derived them; -1 and 0 on dense
  // layers (cpu-ref's RoutingLog convention).
  std::vector<int32_t> route_experts;
  std::vector<float> route_weights;
};

class Emulator {
 public:
  // `weights` (and the bytes behind them) and `kv` must outlive the emulator.
  Emulator(const ModelConfig& config, const ModelWeights& weights, ref::KvStore& kv);

  // Runs one decode step. Error for a timed-out wait, a failed tile (bad token, an attention item
  // run twice, non-finite router logits) or counters that end off their planned totals.
  void run(const Plan& plan, const StepInput& input, const EmulatorOptions& options, StepOutput& output);

 private:
  const ModelConfig config_;
  const ModelWeights& weights_;
  ref::KvStore& kv_;
  WidenedNorms norms_;
  std::vector<double> arena_;  // the step's buffers (8-byte aligned), reused between steps
};

}  // namespace megadecode::emu
