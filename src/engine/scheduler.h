// The continuous-batching scheduler (DESIGN §6). One iteration, step():
//   1. admit waiting sequences (FIFO) while a slot and their prompt's KV blocks are free, reusing
//      prefix-cached blocks;
//   2. prefill at most max_prefill_tokens prompt tokens (chunked across iterations), so running
//      sequences keep decoding between the chunks of a long prompt;
//   3. decode every sequence whose prompt is in: one token each, in one backend call; a sequence
//      that needs a new block when none is free preempts the newest running sequence (its blocks
//      are freed; it waits again at the front and recomputes its tokens when readmitted).
// A prompt's last token always goes through decode, so the backend does all sampling.
// Finished, aborted and failed sequences free their blocks at once.
// Threading: single-threaded; the Engine's scheduler thread owns it (tests drive it directly).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "engine/backend.h"
#include "engine/metrics.h"
#include "engine/output_processor.h"
#include "engine/request.h"
#include "kv/kv_cache.h"

namespace megadecode {

struct SchedulerConfig {
  int max_num_seqs = 64;         // running sequences at most (the decode batch)
  int max_prefill_tokens = 256;  // prompt tokens prefilled per iteration
  bool prefix_caching = true;
  bool check_invariants = false;  // run the KV and scheduler checkers after every mutation
};

class Scheduler {
 public:
  Scheduler(Backend& backend, const SchedulerConfig& config, TextDecoderFactory decoders, EngineMetrics* metrics);
  ~Scheduler();

  // Queues a sequence at the back of the waiting queue. The request must be valid (Engine checks).
  void add(SequenceRequest request);
  // Ends every sequence of request_id (waiting or running) with finish reason abort.
  void abort(uint64_t request_id);
  // Ends every sequence with `reason` (shutdown).
  void abort_all(FinishReason reason, const std::string& message);

  // One iteration; false when there was nothing to do.
  bool step();
  bool idle() const { return waiting_.empty() && running_.empty(); }
  int n_running() const { return static_cast<int>(running_.size()); }
  int n_waiting() const { return static_cast<int>(waiting_.size()); }
  const KvCache& kv() const { return kv_; }
  const SchedulerConfig& config() const { return config_; }
  uint64_t n_preemptions() const { return n_preemptions_; }

  // KV invariants plus: every running sequence holds a table, no waiting one does, and the
  // tables cover what was computed.
  void check_invariants() const;

 private:
  struct Sequence;
  void admit();
  void prefill();
  void decode();
  void preempt(size_t running_index);
  void emit(Sequence& seq, OutputProcessor::Step&& step, std::vector<int32_t> tokens, std::vector<TokenLogprob> logprobs,
            const std::string& error = "");
  void finish_running(size_t running_index, FinishReason reason, const std::string& error);
  void end_sequence(Sequence& seq, FinishReason reason, const std::string& error);
  void publish_gauges();  // the metrics' gauges, after every change of the queues or the KV pool
  void checkpoint() const {
    if (config_.check_invariants) check_invariants();
  }

  Backend& backend_;
  SchedulerConfig config_;
  TextDecoderFactory decoders_;
  EngineMetrics* metrics_;
  KvCache kv_;
  int64_t next_seq_id_ = 1;
  uint64_t n_preemptions_ = 0;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order; preemption takes from the back
  std::vector<float> logits_;                       // [vocab] prompt-logprob scratch
};

}  // namespace megadecode
