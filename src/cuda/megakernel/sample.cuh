// SAMPLE on the device, one token row at a time by the 256 consumer threads: the LM head tiles'
// argmax pass merged (lm_best, one entry a tile), then the row sampler of
// cuda/common/sampling.cuh (the contract of sampling/params.h: vLLM's order, greedy below
// kGreedyTemperature, top-k keeps exactly k tokens, ties to the lower token id, a Gumbel-max draw
// keyed by (seed, position, token)), reading logits other SMs wrote in this launch with
// ld.global.cg and meeting at the consumer barrier. A constrained row (its slot in token_masks >= 0,
// read only when the step carries masks, MkParams::token_masks) takes the row sampler's own argmax
// pass over the masked logits (masked_loader): the LM head tiles' lm_best knows no mask.
#pragma once

#include <cstdint>

#include "cuda/common/sampling.cuh"
#include "cuda/megakernel/smem.cuh"
#include "sampling/params.h"

namespace megadecode::cuda::mk {

// Samples rows [arg0, arg1) of the task.
// (Out of line, its rows by value: it runs once a step.)
__device__ __noinline__ bool op_sample(const MkParams& p, int row_begin, int row_end, SampleScratch& sc) {
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  for (int t = row_begin; t < row_end; ++t) {
    const float* row = buf<float>(p, b.logits) + static_cast<int64_t>(t) * s.vocab;
    const SamplingParams sp = buf<const SamplingParams>(p, b.sampling)[t];
    const int64_t position = buf<int32_t>(p, b.seq_len)[t];
    auto ld = [&](int i) { return __ldcg(row + i); };
    int32_t token;
    // [B] slots, then the masks of the constrained rows (plan/step_upload.h pack_token_masks);
    // host-written before the launch.
    const int32_t slot = p.token_masks ? buf<const int32_t>(p, b.token_masks)[t] : -1;
    if (slot >= 0) {
      const uint32_t* mask = buf<const uint32_t>(p, b.token_masks) + s.batch +
                             static_cast<int64_t>(slot) * static_cast<int64_t>(token_mask_words(s.vocab));
      token = sample_row<kConsumerThreads>(masked_loader(ld, mask), s.vocab, sp, position, sc, [] { consumer_sync(); });
    } else if (p.flags & kMkSampleFullPass) {  // the switch: the row sampler's own argmax pass over the row
      token = sample_row<kConsumerThreads>(ld, s.vocab, sp, position, sc, [] { consumer_sync(); });
    } else {  // the argmax pass is the LM head tiles' (lm_best): merge their n_lm_tasks entries
      const LogitBest* best = buf<const LogitBest>(p, b.lm_best) + t;
      float mx = -INFINITY;
      int arg = 0x7fffffff;
      for (int i = threadIdx.x; i < s.n_lm_tasks; i += kConsumerThreads) {
        const int2 e = __ldcg(reinterpret_cast<const int2*>(best + static_cast<int64_t>(i) * s.batch));
        argmax_merge(mx, arg, __int_as_float(e.x), e.y);
      }
      row_argmax(mx, arg, sc, [] { consumer_sync(); });
      token = sample_row_given_max<kConsumerThreads>(ld, s.vocab, sp, position, mx, arg, sc, [] { consumer_sync(); });
    }
    if (threadIdx.x == 0) buf<int32_t>(p, b.out_tokens)[t] = token;
  }
  return true;
}

}  // namespace megadecode::cuda::mk
