// The tail of what a decode step copies back to its pinned slot after its tokens: the raw logits
// [rows][vocab] when asked, then the logprobs [rows] (row_logprobs) when asked. One layout for the
// megakernel step and the batched step: the copies enqueued after the step, read once its event
// has fired.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/common/cuda_check.h"
#include "cuda/common/kernels.h"

namespace megadecode::cuda {

struct StepOutputTail {
  int rows = 0, vocab = 0;
  bool logits = false, logprobs = false;

  size_t logit_bytes() const { return logits ? static_cast<size_t>(rows) * vocab * sizeof(float) : 0; }
  size_t bytes() const { return logit_bytes() + (logprobs ? rows * sizeof(RowLogprobs) : 0); }

  // Enqueues on `stream` the copies into dst (pinned, bytes() long) from the step's logits
  // [rows][vocab] and tokens [rows] (device); the logprobs go through `scratch` ([rows], device).
  void enqueue(uint8_t* dst, const float* d_logits, const int32_t* d_tokens, RowLogprobs* scratch,
               cudaStream_t stream) const {
    if (logits) CUDA_CHECK(cudaMemcpyAsync(dst, d_logits, logit_bytes(), cudaMemcpyDeviceToHost, stream));
    if (logprobs) {
      row_logprobs(d_logits, vocab, rows, vocab, d_tokens, scratch, stream);
      CUDA_CHECK(cudaMemcpyAsync(dst + logit_bytes(), scratch, rows * sizeof(RowLogprobs), cudaMemcpyDeviceToHost,
                                 stream));
    }
  }
  // Reads them back (after the step's event) into out_logits and out_logprobs (empty when not asked).
  void unpack(const uint8_t* src, std::vector<float>& out_logits, std::vector<RowLogprobs>& out_logprobs) const {
    const auto* l = reinterpret_cast<const float*>(src);
    out_logits.assign(l, l + logit_bytes() / sizeof(float));
    const auto* lp = reinterpret_cast<const RowLogprobs*>(src + logit_bytes());
    out_logprobs.assign(lp, lp + (logprobs ? rows : 0));
  }
};

}  // namespace megadecode::cuda
