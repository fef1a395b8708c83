// The engine's view of its backend: forwards every call, and remembers the first failure of a
// step (prefill or decode threw: a CUDA error, a megakernel watchdog timeout, a CPU backend's
// Error). After a failure the device state is unknown, so every later call fails at once without
// touching the backend, and the Engine ends every sequence with an error and stops (the process
// should be restarted; server/shutdown.h exits non-zero).
// Threading: the calls belong to the scheduler thread; failed() and failure() may be read from
// any thread.
#pragma once

#include <atomic>
#include <mutex>
#include <string>

#include "engine/backend.h"

namespace megadecode {

class BackendGuard : public Backend {
 public:
  explicit BackendGuard(Backend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  const ModelConfig& config() const override { return inner_.config(); }
  int kv_block_size() const override { return inner_.kv_block_size(); }
  int n_kv_blocks() const override { return inner_.n_kv_blocks(); }
  int n_ring_blocks() const override { return inner_.n_ring_blocks(); }
  void prefill(const SeqChunk& chunk, std::span<float> last_logits) override;
  void decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) override;
  int max_decode_batch() const override { return inner_.max_decode_batch(); }
  // Mixed steps reach the backend as mixed steps (the default would split them into calls).
  void decode_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs, bool want_logits,
                    DecodeResult& result) override;
  int max_mixed_prompt_rows() const override { return inner_.max_mixed_prompt_rows(); }
  // Asynchronous steps reach the backend as such (the defaults would run them synchronously here),
  // and a failure surfacing when a step is collected counts like one at its launch.
  DecodeTicket decode_async(std::span<const DecodeSeq> seqs, bool want_logits) override;
  DecodeTicket decode_async_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs,
                                  bool want_logits) override;
  void collect(DecodeTicket ticket, DecodeResult& result) override;
  bool runs_async() const override { return inner_.runs_async(); }
  int max_device_logprobs() const override { return inner_.max_device_logprobs(); }

  bool failed() const { return failed_.load(); }
  std::string failure() const;  // the first failure's message; "" when none

 private:
  template <class Call>
  void guarded(const char* what, Call&& call);

  Backend& inner_;
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;  // guards failure_
  std::string failure_;
};

}  // namespace megadecode
