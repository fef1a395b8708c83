// The `cpu-ref` backend: the fp32 reference model over a paged fp32 KV store, sampling on the
// host. Slow and obvious; the oracle the other backends are compared with.
// Threading: one caller at a time (Backend's contract); matvecs use an internal thread pool.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "engine/backend.h"
#include "model/weights.h"
#include "ref/kv_store.h"
#include "ref/parallel.h"
#include "ref/ref_model.h"

namespace megadecode::ref {

class RefBackend : public Backend {
 public:
  // `weights_owner` keeps the bytes the weight views point at alive (a checkpoint, a TensorStore).
  // From BackendOptions: kv_block_size, n_kv_blocks (> 0), n_ring_blocks (models with sliding-window
  // layers: the ring pool, 0: n_kv_blocks; ignored otherwise) and n_threads (0: one per hardware thread).
  RefBackend(const ModelConfig& config, const ModelWeights& weights, std::shared_ptr<const void> weights_owner,
             const BackendOptions& options);

  std::string name() const override { return "cpu-ref"; }
  const ModelConfig& config() const override { return config_; }
  int kv_block_size() const override { return kv_.block_size(); }
  int n_kv_blocks() const override { return kv_.n_blocks(); }
  int n_ring_blocks() const override { return kv_.n_ring_blocks(); }

  void prefill(const SeqChunk& chunk, std::span<float> last_logits) override;
  void decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) override;

  // Like prefill, with the logits of every position: logits [n_tokens, vocab].
  void prefill_all_logits(const SeqChunk& chunk, std::span<float> logits);
  // The KV storage (tests poison it).
  KvStore& kv_store() { return kv_; }
  // Comparisons with the CUDA paths (ref_model.h): the device's bf16 rounding points, and a forced
  // routing audited against this model's own choice.
  void set_device_rounding(bool on) { model_.set_device_rounding(on); }
  void set_forced_routing(const RoutingLog* forced, RoutingAudit* audit) { model_.set_forced_routing(forced, audit); }
  void set_routing_record(RoutingLog* log) { model_.set_routing_record(log); }

 private:
  const ModelConfig config_;
  std::shared_ptr<const void> weights_owner_;
  ThreadPool pool_;
  KvStore kv_;
  RefModel model_;
};

}  // namespace megadecode::ref
