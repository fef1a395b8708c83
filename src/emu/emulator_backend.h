// The `cpu-mk` backend: every decode step is planned (src/plan), validated, and run by the CPU
// emulator of the megakernel with one thread per emulated SM; sampling on the host (ref sampler).
// Sliding-window layers keep their K/V in the ring pool (SeqChunk::ring_table), as cpu-ref does.
// Prefill runs the chunk's tokens as consecutive one-token decode steps (the LM head only for the
// last one), so every token the backend ever computes goes through a Plan.
// Threading: one caller at a time (Backend's contract).
#pragma once

#include <memory>
#include <string>

#include "emu/emulator.h"
#include "engine/backend.h"
#include "model/routing.h"
#include "model/weights.h"
#include "plan/planner.h"
#include "ref/kv_store.h"

namespace megadecode::emu {

constexpr int kDefaultSms = 8;  // emulated SMs when BackendOptions::n_threads is 0

class CpuMkBackend : public Backend {
 public:
  // From BackendOptions: kv_block_size, n_kv_blocks (> 0), n_ring_blocks (models with
  // sliding-window layers: the ring pool, as cpu-ref's; 0: as many as n_kv_blocks), n_threads (emulated SMs = threads,
  // 1..132; 0: kDefaultSms) and policy. `emulator`: the emulator's test knobs (random delays).
  CpuMkBackend(const ModelConfig& config, const ModelWeights& weights, std::shared_ptr<const void> weights_owner,
               const BackendOptions& options, const EmulatorOptions& emulator = {});

  std::string name() const override { return "cpu-mk"; }
  const ModelConfig& config() const override { return config_; }
  int kv_block_size() const override { return kv_.block_size(); }
  int n_kv_blocks() const override { return kv_.n_blocks(); }
  int n_ring_blocks() const override { return kv_.n_ring_blocks(); }

  void prefill(const SeqChunk& chunk, std::span<float> last_logits) override;
  void decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) override;

  ref::KvStore& kv_store() { return kv_; }
  // Records the routing of every token the backend computes into `log` (n_layers x top_k of the
  // model), as the plan's down shares derived it; nullptr: off.
  void set_routing_record(RoutingLog* log);
  // Tiles sized for a CPU-sized model (the GPU defaults would give one tile per op here).
  Policy& policy() { return policy_; }

 private:
  Plan plan_step(const BatchState& batch, bool lm_head, bool sample) const;
  void record_routing(const StepOutput& out, std::span<const std::pair<int64_t, int>> rows);  // (seq id, position)

  const ModelConfig config_;
  const ModelWeights weights_;
  std::shared_ptr<const void> weights_owner_;
  int n_sms_ = 0;
  EmulatorOptions emulator_options_;
  Policy policy_;
  ref::KvStore kv_;
  Emulator emulator_;
  RoutingLog* routing_record_ = nullptr;
};

}  // namespace megadecode::emu
