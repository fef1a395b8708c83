// CudaBackend's host part of a step finished inside decode_async (see cuda_backend.h): the routing
// capture recorded, the penalised rows resampled by the host sampler, and the host's tokens written
// back to the chain buffer for a next step chained to this one.
#include <vector>

#include "core/check.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cuda_check.h"
#include "engine/logits.h"
#include "sampling/host_sampler.h"

namespace megadecode::cuda {

void CudaBackend::record_routing(int64_t seq, int first_pos, int n_tokens, const int32_t* experts,
                                 const float* weights) {
  const size_t per = static_cast<size_t>(config().n_layers) * config().n_experts_per_tok;
  for (int i = 0; i < n_tokens; ++i)
    routing_log_->record(seq, first_pos + i, std::span(experts + i * per, per), std::span(weights + i * per, per));
}

void CudaBackend::complete_on_host(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs, Pending& step) {
  finish(step);
  if (step.error) return;
  try {
    const ModelConfig& c = config();
    const int B = static_cast<int>(seqs.size());
    if (routing_log_) {
      std::vector<int32_t> ids;
      std::vector<float> w;
      const size_t per = static_cast<size_t>(c.n_layers) * c.n_experts_per_tok;
      if (step.path == DecodePath::kMegakernel) {
        megakernel_->read_routing(B, ids, w);
      } else {
        int prompt_rows = 0;
        for (const SeqChunk& p : prompts) prompt_rows += static_cast<int>(p.tokens.size());
        batched_->read_routing(batched::BatchedStep::prompt_row0(B) + prompt_rows, ids, w);
      }
      for (int i = 0; i < B; ++i)
        record_routing(seqs[i].chunk.seq_id, seqs[i].chunk.start_pos, 1, ids.data() + i * per, w.data() + i * per);
      size_t row = batched::BatchedStep::prompt_row0(B);  // the pieces' rows follow the decode rows' bucket
      for (const SeqChunk& p : prompts) {
        record_routing(p.seq_id, p.start_pos, static_cast<int>(p.tokens.size()), ids.data() + row * per,
                       w.data() + row * per);
        row += p.tokens.size();
      }
    }
    const size_t V = static_cast<size_t>(c.vocab_size);
    const std::vector<int32_t> device_tokens = step.result.tokens;
    resample_penalised(seqs, step.result, [&](size_t i, std::vector<float>& row) {
      row.resize(V);
      if (step.path == DecodePath::kMegakernel) {
        megakernel_->read_logits(i, row);
      } else {
        CUDA_CHECK(cudaMemcpy(row.data(), batched_->logits_row(static_cast<int>(i)), V * sizeof(float),
                              cudaMemcpyDeviceToHost));
      }
    });
    if (step.result.tokens != device_tokens) {  // a next step chained to this one reads the host's tokens
      CUDA_CHECK(cudaMemcpyAsync(chain_, step.result.tokens.data(), step.result.tokens.size() * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));  // from pageable memory
    }
  } catch (...) {
    step.error = std::current_exception();  // collect() rethrows it
  }
}

// Presence/frequency/repetition penalties need each sequence's token history, which the device
// sampler does not have: such sequences (rare in serving) read their logits row back and are
// sampled by the host sampler (sampling/host_sampler.h, the cpu backends' own, vLLM's order), replacing
// the device's token. Costs one 4*vocab-byte copy per penalised sequence.
void CudaBackend::resample_penalised(std::span<const DecodeSeq> seqs, DecodeResult& result,
                                     const std::function<void(size_t, std::vector<float>&)>& read_row) {
  const size_t V = static_cast<size_t>(config().vocab_size);
  std::vector<float> row;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DecodeSeq& s = seqs[i];
    if (!s.sampling.has_penalties()) continue;
    if (!result.logits.empty()) {
      row.assign(result.logits.begin() + i * V, result.logits.begin() + (i + 1) * V);
    } else {
      read_row(i, row);
    }
    MD_REQUIRE(s.history_prompt_len <= s.history.size(), "decode: sequence ", i, ": history_prompt_len ",
               s.history_prompt_len, " beyond its history of ", s.history.size());
    const sampling::TokenHistory h{s.history.first(s.history_prompt_len), s.history.subspan(s.history_prompt_len)};
    result.tokens[i] = sampling::sample_token(row, s.sampling, s.chunk.start_pos + 1, h, s.allowed);
    if (s.logprobs >= 0 && i < result.logprobs.size())  // the device's were of its own token
      result.logprobs[i] = token_logprob(row, result.tokens[i], s.logprobs);
  }
}

}  // namespace megadecode::cuda
