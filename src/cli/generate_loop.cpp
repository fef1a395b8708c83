#include "cli/generate_loop.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "kv/kv_cache.h"
#include "sampling/host_sampler.h"

namespace megadecode {

int blocks_needed(const GenerateRequest& request, int block_size) {
  // The last generated token is sampled but never run, so it needs no KV slot.
  const int64_t positions = static_cast<int64_t>(request.prompt.size()) + std::max(request.max_tokens, 1) - 1;
  return static_cast<int>((positions + block_size - 1) / block_size);
}

GenerateResult generate(Backend& backend, const GenerateRequest& request,
                        const std::function<void(int32_t)>& on_token) {
  const ModelConfig& config = backend.config();
  MD_REQUIRE(!request.prompt.empty(), "generate: the prompt is empty");
  MD_REQUIRE(request.max_tokens >= 1, "generate: max_tokens must be at least 1, got ", request.max_tokens);
  for (int32_t t : request.prompt) {
    MD_REQUIRE(t >= 0 && t < config.vocab_size, "generate: prompt token ", t, " outside the vocabulary [0, ",
               config.vocab_size, ")");
  }
  const int n_blocks = blocks_needed(request, backend.kv_block_size());
  MD_REQUIRE(n_blocks <= backend.n_kv_blocks(), "generate: ", request.prompt.size(), " prompt tokens + ",
             request.max_tokens, " new tokens need ", n_blocks, " KV blocks, the backend has ", backend.n_kv_blocks());
  sampling::validate(request.sampling);
  std::vector<int32_t> table(n_blocks);
  std::iota(table.begin(), table.end(), 0);
  // Sliding-window layers keep their K/V in a ring of at most R blocks (kv/kv_cache.h).
  const int n_ring = std::min(n_blocks, kv_ring_length(config.max_sliding_window(), backend.kv_block_size()));
  MD_REQUIRE(n_ring <= backend.n_ring_blocks(), "generate: the sliding-window layers need a ring of ", n_ring,
             " KV blocks, the backend stores ", backend.n_ring_blocks());
  std::vector<int32_t> ring(n_ring);
  std::iota(ring.begin(), ring.end(), 0);

  std::vector<float> logits(config.vocab_size);
  backend.prefill(SeqChunk{0, request.prompt, 0, table, ring}, logits);
  std::vector<int32_t> history = request.prompt;  // prompt, then generated tokens
  const size_t n_prompt = request.prompt.size();
  int32_t token = sampling::sample_token(logits, request.sampling, static_cast<int64_t>(n_prompt),
                                    sampling::TokenHistory{request.prompt, {}});
  GenerateResult result;
  DecodeResult step;
  for (;;) {
    result.tokens.push_back(token);
    history.push_back(token);
    if (on_token) on_token(token);
    const bool is_eos = std::find(request.eos_token_ids.begin(), request.eos_token_ids.end(), token) !=
                        request.eos_token_ids.end();
    if (is_eos && !request.ignore_eos) {
      result.finish_reason = "stop";
      return result;
    }
    if (static_cast<int>(result.tokens.size()) >= request.max_tokens) {
      result.finish_reason = "length";
      return result;
    }
    DecodeSeq seq;
    const int pos = static_cast<int>(history.size()) - 1;  // the token just sampled
    seq.chunk = SeqChunk{0, std::span(history).subspan(pos, 1), pos, table, ring};
    seq.sampling = request.sampling;
    seq.history = history;
    seq.history_prompt_len = n_prompt;
    backend.decode(std::span(&seq, 1), false, step);
    token = step.tokens.at(0);
  }
}

}  // namespace megadecode
