// The interface every execution backend implements: cpu-ref (fp32 reference), cpu-mk (CPU
// emulator of the megakernel plan), cuda-mk (the megakernel) and cuda-ops (one kernel per op).
// The engine owns the KV block allocator (which physical blocks a sequence holds); a backend owns
// the KV storage, n_kv_blocks() blocks of kv_block_size() tokens each.
//
// Threading: one caller at a time (the engine's scheduler thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "sampling/params.h"

namespace megadecode {

// One sequence's share of a forward call: `tokens` sit at positions start_pos, start_pos+1, ...
// The block table maps logical block i (positions [i*B, (i+1)*B)) to a physical KV block and
// covers at least start_pos + tokens.size() positions.
struct SeqChunk {
  int64_t seq_id = 0;
  std::span<const int32_t> tokens;
  int start_pos = 0;
  std::span<const int32_t> block_table;
};

// One sequence in a decode step: exactly one new token.
struct DecodeSeq {
  SeqChunk chunk;
  SamplingParams sampling;
  // Token history for presence/frequency/repetition penalties (prompt + generated); may be empty
  // when no penalty is set.
  std::span<const int32_t> history;
  // history[0, history_prompt_len) is the prompt: the repetition penalty sees all of history, the
  // presence/frequency penalties only the generated part after it (vLLM).
  size_t history_prompt_len = 0;
};

struct DecodeResult {
  std::vector<int32_t> tokens;  // [n_seqs] sampled next tokens
  std::vector<float> logits;    // [n_seqs, vocab] raw logits, filled only when asked for
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual int kv_block_size() const = 0;
  virtual int n_kv_blocks() const = 0;

  // Runs the chunk's tokens, writes their K/V, and writes the logits of the chunk's last token to
  // `last_logits` [vocab] when it is non-empty.
  virtual void prefill(const SeqChunk& chunk, std::span<float> last_logits) = 0;

  // One decode step over a batch: writes each sequence's new K/V, samples its next token.
  // With want_logits, also returns the raw logits.
  virtual void decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) = 0;
};

}  // namespace megadecode
