#include "ref/ref_backend.h"

#include <vector>

#include "core/check.h"
#include "sampling/host_sampler.h"
#include "sampling/token_mask.h"

namespace megadecode::ref {

namespace {
// The ring pool's blocks: a sequence never holds more ring than full blocks, so as many as the full
// pool never bind first (the default); none without sliding layers.
int ring_blocks(const ModelConfig& config, const BackendOptions& options) {
  if (config.max_sliding_window() == 0) return 0;
  return options.n_ring_blocks > 0 ? options.n_ring_blocks : options.n_kv_blocks;
}
}  // namespace

RefBackend::RefBackend(const ModelConfig& config, const ModelWeights& weights,
                       std::shared_ptr<const void> weights_owner, const BackendOptions& options)
    : config_(config),
      weights_owner_(std::move(weights_owner)),
      pool_(options.n_threads),
      kv_(config, options.kv_block_size, options.n_kv_blocks, ring_blocks(config, options)),
      model_(config_, weights, &pool_) {}

void RefBackend::prefill(const SeqChunk& chunk, std::span<float> last_logits) {
  MD_REQUIRE(last_logits.empty() || last_logits.size() == static_cast<size_t>(config_.vocab_size),
             "prefill: last_logits holds ", last_logits.size(), " floats, expected 0 or vocab ", config_.vocab_size);
  model_.forward(chunk, kv_, last_logits);
}

void RefBackend::prefill_all_logits(const SeqChunk& chunk, std::span<float> logits) {
  MD_REQUIRE(logits.size() == chunk.tokens.size() * config_.vocab_size, "prefill: logits hold ", logits.size(),
             " floats, expected n_tokens * vocab = ", chunk.tokens.size() * config_.vocab_size);
  model_.forward(chunk, kv_, logits);
}

void RefBackend::decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) {
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  for (const DecodeSeq& s : seqs) {
    MD_REQUIRE(s.chunk.tokens.size() == 1, "decode: sequence ", s.chunk.seq_id, " has ", s.chunk.tokens.size(),
               " tokens, expected exactly 1");
    MD_REQUIRE(s.history_prompt_len <= s.history.size(), "decode: sequence ", s.chunk.seq_id,
               ": history_prompt_len ", s.history_prompt_len, " exceeds the history of ", s.history.size());
    sampling::validate(s.sampling);
    sampling::check_token_mask(s.allowed, vocab);
  }
  result.tokens.assign(seqs.size(), 0);
  result.logits.assign(want_logits ? seqs.size() * vocab : 0, 0.0f);
  std::vector<float> logits(vocab);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DecodeSeq& s = seqs[i];
    model_.forward(s.chunk, kv_, logits);
    const sampling::TokenHistory history{s.history.first(s.history_prompt_len), s.history.subspan(s.history_prompt_len)};
    // The sampled token takes the position after the one just run.
    result.tokens[i] = sampling::sample_token(logits, s.sampling, s.chunk.start_pos + 1, history, s.allowed);
    if (want_logits) std::copy(logits.begin(), logits.end(), result.logits.begin() + i * vocab);
  }
}

}  // namespace megadecode::ref
