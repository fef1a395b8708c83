// The one range check of BackendOptions and the synchronous defaults of the asynchronous decode
// (backend.h).
#include "engine/backend.h"

#include "core/check.h"
#include "core/stopwatch.h"

namespace megadecode {

void check_backend_options(const BackendOptions& o) {
  MD_REQUIRE(o.kv_block_size >= 1 && o.kv_block_size <= BackendOptions::kMaxKvBlockSize,
             "--block-size must be in [1, ", BackendOptions::kMaxKvBlockSize, "], got ", o.kv_block_size);
  MD_REQUIRE(o.n_threads >= 0 && o.n_threads <= BackendOptions::kMaxThreads, "--threads must be in [0, ",
             BackendOptions::kMaxThreads, "], got ", o.n_threads);
  MD_REQUIRE(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0,
             "--gpu-memory-utilization must be in (0, 1], got ", o.gpu_memory_utilization);
  MD_REQUIRE(o.prefill_chunk >= 0 && o.prefill_chunk <= BackendOptions::kMaxPrefillChunk,
             "--prefill-chunk must be in [0, ", BackendOptions::kMaxPrefillChunk, "], got ", o.prefill_chunk);
  MD_REQUIRE(o.n_ring_blocks >= 0, "n_ring_blocks must be >= 0, got ", o.n_ring_blocks);
  MD_REQUIRE(o.wait_timeout_ms >= 1, "wait_timeout_ms must be >= 1, got ", o.wait_timeout_ms);
  MD_REQUIRE(o.max_batch >= 1 && o.max_batch <= BackendOptions::kMaxBatch, "--max-num-seqs must be in [1, ",
             BackendOptions::kMaxBatch, "], got ", o.max_batch);
}

void require_no_ring_table(const SeqChunk& chunk, const std::string& backend) {
  MD_REQUIRE(chunk.ring_table.empty(), backend, ": sequence ", chunk.seq_id, " carries a ring table of ",
             chunk.ring_table.size(), " blocks (sliding-window layers), which this backend does not store");
}

DecodeTicket Backend::decode_async(std::span<const DecodeSeq> seqs, bool want_logits) {
  return decode_async_mixed({}, seqs, want_logits);
}

void Backend::decode_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs, bool want_logits,
                           DecodeResult& result) {
  for (const SeqChunk& p : prompts) prefill(p, {});
  decode(seqs, want_logits, result);
}

DecodeTicket Backend::decode_async_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs,
                                         bool want_logits) {
  // Rows chained to the previous step take its token, as a device would read it from its output.
  std::vector<DecodeSeq> resolved(seqs.begin(), seqs.end());
  std::vector<int32_t> inputs(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DecodeSeq& s = seqs[i];
    if (s.prev_row < 0) continue;
    MD_REQUIRE(static_cast<size_t>(s.prev_row) < last_tokens_.size(), "decode_async: row ", i, " takes row ",
               s.prev_row, " of the previous step, which had ", last_tokens_.size());
    MD_REQUIRE(s.chunk.tokens.empty() && !s.sampling.has_penalties(), "decode_async: row ", i,
               " is chained to the previous step but has its own token or penalties");
    inputs[i] = last_tokens_[s.prev_row];
    resolved[i].chunk.tokens = std::span<const int32_t>(&inputs[i], 1);
    resolved[i].prev_row = -1;
  }
  FinishedStep step{next_ticket_++, {}};
  const Stopwatch compute;
  if (prompts.empty()) {
    decode(resolved, want_logits, step.result);
  } else {
    decode_mixed(prompts, resolved, want_logits, step.result);
  }
  DecodeTicket ticket{step.ticket, {}};
  ticket.times.compute_s = compute.seconds();
  last_tokens_ = step.result.tokens;
  finished_.push_back(std::move(step));
  return ticket;
}

void Backend::collect(DecodeTicket ticket, DecodeResult& result) {
  MD_REQUIRE(!finished_.empty() && finished_.front().ticket == ticket.id, "collect: ticket ", ticket.id,
             " is not the oldest step in flight");
  result = std::move(finished_.front().result);
  finished_.pop_front();
}

}  // namespace megadecode
