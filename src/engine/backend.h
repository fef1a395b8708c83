// The interface every execution backend implements: cpu-ref (fp32 reference), cpu-mk (CPU
// emulator of the megakernel plan), and the CUDA backends (cuda/backend/cuda_backend.h: cuda,
// cuda-mk, cuda-ops, cuda-batched), and the one options struct they are all built from.
// The engine owns the KV block allocator (which physical blocks a sequence holds); a backend owns
// the KV storage, n_kv_blocks() blocks of kv_block_size() tokens each for the full-attention
// layers, and for a model with sliding-window layers n_ring_blocks() more blocks of the same size
// that hold those layers' K/V in a ring a sequence (kv/kv_cache.h, docs/architecture.md).
//
// Threading: one caller at a time (the engine's scheduler thread).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/token_constraint.h"
#include "model/config.h"
#include "sampling/params.h"

namespace megadecode {

// Every backend's options with the one set of defaults: the CLI fills it from its flags, the
// factory (cli/backend_factory.h) hands it unchanged to the backend it builds, and each backend
// reads the fields that concern it (and checks them: an Error names the flag).
struct BackendOptions {
  std::string backend = "cpu-ref";      // cpu-ref | cpu-mk | cuda | cuda-mk | cuda-ops | cuda-batched
  int kv_block_size = 16;               // tokens per KV block (1..kMaxKvBlockSize)
  int n_kv_blocks = 0;                  // KV blocks the backend stores; CPU backends need > 0, the
                                        // CUDA backends take 0 as "what gpu_memory_utilization allows"
  int n_ring_blocks = 0;                // cpu-ref, models with sliding-window layers: blocks of the
                                        // ring pool (those layers' K/V); 0: as many as n_kv_blocks
                                        // (a sequence never holds more ring than full blocks)
  int n_threads = 0;                    // cpu-ref: worker threads (0: one per hardware thread);
                                        // cpu-mk: emulated SMs (0: 8)
  double gpu_memory_utilization = 0.9;  // CUDA: share of the GPU's memory for weights + KV
  // CUDA: tokens per prefill kernel pass (src/cuda/prefill; routing-exact against cpu-ref on the
  // H200), 0..kMaxPrefillChunk; 0 runs prefill through the decode step one token at a time (the
  // comparison baseline). 8192 like vLLM's token budget on large GPUs: an expert's weights are read
  // once for ~512 of a piece's rows (H200, 8K prompt: 39.2k tok/s against 33.6k at 2048).
  int prefill_chunk = 8192;
  std::string policy = "default";       // CUDA: decode plan policy (plan/policy.h)
  int n_sms = 0;                        // CUDA: SMs the plan uses, 0: every SM of the device
  int64_t wait_timeout_ms = 2000;       // CUDA: bound on any single counter wait inside a step
  uint32_t kernel_flags = 0;            // CUDA: MkFlag bits (cuda/megakernel/types.h), benchmark ablations
  int max_batch = 256;                  // CUDA: the largest decode batch (serve: --max-num-seqs); sizes
                                        // the batched step's workspace

  static constexpr int kMaxKvBlockSize = 1024;
  static constexpr int kMaxThreads = 4096;
  static constexpr int kMaxPrefillChunk = 65536;
  static constexpr int kMaxBatch = 1024;
};

// The one check of the options' ranges, wherever they come from: the CLI's flags
// (cli/backend_flags.h, so a typo is the first error, before any model or GPU work), the
// benchmarks' flags, and the CUDA backend for callers that fill the struct themselves. An Error
// names the flag that sets the field (--block-size, --threads, --gpu-memory-utilization,
// --prefill-chunk); fields without a flag are named as fields.
void check_backend_options(const BackendOptions& options);

// One sequence's share of a forward call: `tokens` sit at positions start_pos, start_pos+1, ...
// The block table maps logical block i (positions [i*B, (i+1)*B)) to a physical KV block and
// covers at least start_pos + tokens.size() positions. The ring table holds the sequence's blocks
// of the ring pool (sliding-window layers): position p lives in ring_table[(p / B) % R], slot
// p % B, with R = kv_ring_length(config.max_sliding_window(), B)
// (kv/kv_cache.h); it has min(R, blocks covering the
// positions) entries, and is empty for a model without sliding layers.
struct SeqChunk {
  int64_t seq_id = 0;
  std::span<const int32_t> tokens;
  int start_pos = 0;
  std::span<const int32_t> block_table;
  std::span<const int32_t> ring_table;
};

// For backends that store no ring pool (the plan-driven ones: they refuse models with
// sliding-window layers by name, check_model_plannable / DeviceWeights): an Error naming the
// backend when a chunk carries a ring table anyway, rather than K/V written where no layer reads.
void require_no_ring_table(const SeqChunk& chunk, const std::string& backend);

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
  // Structured output: the tokens this row may sample, a packed bitmask of token_mask_words(vocab)
  // words (engine/token_constraint.h); empty: every token. Every backend samples among set bits only.
  std::span<const uint32_t> allowed;
  // The top logprobs the row's token needs (-1: none). A backend whose max_device_logprobs() is at
  // least this returns them in DecodeResult::logprobs; for the others the engine asks for the logits
  // and computes them (engine/logits.h).
  int logprobs = -1;
  // decode_async only: >= 0 when the input token is the one this backend sampled for row prev_row
  // of the step launched just before (still running, perhaps: the engine chains steps); then
  // chunk.tokens is empty, and the row has no penalties (its history would lack that token).
  int prev_row = -1;
};

// Host time decode_async() spent on one step's phases, in seconds (the engine adds its own:
// scheduling, output processing, and the wait in collect()).
struct DecodeTimes {
  double plan_s = 0.0;     // building or patching the step's plan
  double stage_s = 0.0;    // filling the staging buffers and issuing the uploads
  double compute_s = 0.0;  // the step's work done on the calling thread (CPU backends: all of it)
};

struct DecodeResult {
  std::vector<int32_t> tokens;  // [n_seqs] sampled next tokens
  std::vector<float> logits;    // [n_seqs, vocab] raw logits, filled only when asked for
  // [n_seqs] or empty: row i's token logprob and its top DecodeSeq::logprobs (token_logprob's), for
  // the rows that asked, from a backend that computes them (max_device_logprobs).
  std::vector<TokenLogprob> logprobs;
};

// A decode step started by decode_async(), to be collected once.
struct DecodeTicket {
  uint64_t id = 0;
  DecodeTimes times;  // what decode_async() spent on the step's host phases
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual int kv_block_size() const = 0;
  virtual int n_kv_blocks() const = 0;
  // Blocks of the ring pool (sliding-window layers' K/V); 0 for a model without sliding layers and
  // for backends that do not run such models.
  virtual int n_ring_blocks() const { return 0; }
  // The most sequences one decode() takes.
  virtual int max_decode_batch() const { return BackendOptions::kMaxBatch; }

  // Runs the chunk's tokens, writes their K/V, and writes the logits of the chunk's last token to
  // `last_logits` [vocab] when it is non-empty.
  virtual void prefill(const SeqChunk& chunk, std::span<float> last_logits) = 0;

  // One decode step over a batch: writes each sequence's new K/V, samples its next token.
  // With want_logits, also returns the raw logits.
  virtual void decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) = 0;

  // The same step, asynchronous (the engine's overlapped loop): decode_async() starts it and
  // returns; collect() waits for it and fills `result`. Tickets are collected once each, in launch
  // order; at most two steps are in flight (the engine launches step N+1, then collects step N).
  // decode_async() reads `seqs` only before it returns. Calls are ordered like one CUDA stream:
  // a prefill or a step sees the KV every earlier step wrote. A row's prev_row refers to the step
  // launched just before, whose tokens the backend resolves itself (on the device, for a GPU).
  // The defaults run decode() inside decode_async() (cpu-ref, cpu-mk, test doubles): correct, with
  // nothing to overlap; they resolve prev_row from the tokens of the step they ran last.
  virtual DecodeTicket decode_async(std::span<const DecodeSeq> seqs, bool want_logits);
  virtual void collect(DecodeTicket ticket, DecodeResult& result);

  // A mixed step (chunked prefill in the decode step): the prompt pieces `prompts` (of sequences
  // not in `seqs`; each writes its K/V as prefill() does, nothing is sampled for it) and the decode
  // step of `seqs`, in one call. A backend whose max_mixed_prompt_rows() is > 0 runs both in one
  // pass over the weights (every expert read once for both kinds of rows) and takes up to that many
  // prompt tokens; the default runs prefill() on each piece, then decode(): the same K/V and tokens.
  virtual void decode_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs, bool want_logits,
                            DecodeResult& result);
  virtual int max_mixed_prompt_rows() const { return 0; }
  // decode_async() with prompt pieces: the default runs decode_mixed() (prompts empty: decode()). A
  // backend that overrides decode_async() and mixes overrides this too.
  virtual DecodeTicket decode_async_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs,
                                  bool want_logits);
  // The most top logprobs a row gets from the backend itself (DecodeSeq::logprobs); -1: none (the
  // engine computes them from the logits).
  virtual int max_device_logprobs() const { return -1; }
  // True when decode_async() returns before the step's work is done (a device runs it), so that
  // the engine gains by launching step N+1 before it processes step N's tokens.
  virtual bool runs_async() const { return false; }

 private:
  // The default decode_async's steps, run and waiting to be collected.
  struct FinishedStep {
    uint64_t ticket;
    DecodeResult result;
  };
  std::deque<FinishedStep> finished_;
  std::vector<int32_t> last_tokens_;  // the tokens of the step the default decode_async ran last
  uint64_t next_ticket_ = 1;
};

}  // namespace megadecode
