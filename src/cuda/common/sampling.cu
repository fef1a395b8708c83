// The standalone launcher of the device row sampler (cuda/common/sampling.cuh): one CTA per row, at
// the megakernel's 256 threads or at 1024. The batched decode step samples its rows with it; the
// GPU tests check the row sampler through it.
#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/sampling.cuh"
#include "cuda/common/kernels.h"

namespace megadecode::cuda {
namespace {

template <int kThreads>
__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int stride, int vocab,
                                                          const SamplingParams* params, const int64_t* positions,
                                                          int32_t* tokens, const int32_t* mask_slots,
                                                          const uint32_t* masks) {
  __shared__ RowSampleScratch<kThreads> sc;
  const int row = blockIdx.x;
  if (positions[row] < 0) {  // a padding row (uniform per CTA)
    if (threadIdx.x == 0) tokens[row] = -1;
    return;
  }
  const float* l = logits + static_cast<int64_t>(row) * stride;
  const SamplingParams sp = params[row];
  auto ld = [&](int i) { return l[i]; };
  auto sync = [] { __syncthreads(); };
  const int32_t slot = mask_slots != nullptr ? mask_slots[row] : -1;  // uniform per CTA
  const int32_t token =
      slot >= 0 ? sample_row<kThreads>(masked_loader(ld, masks + static_cast<int64_t>(slot) * token_mask_words(vocab)),
                                       vocab, sp, positions[row], sc, sync)
                : sample_row<kThreads>(ld, vocab, sp, positions[row], sc, sync);
  if (threadIdx.x == 0) tokens[row] = token;
}

}  // namespace

void sample_tokens(const float* logits, int logits_stride, int n_rows, int vocab, const SamplingParams* params,
                   const int64_t* positions, int32_t* tokens, int threads, cudaStream_t stream,
                   const int32_t* mask_slots, const uint32_t* masks) {
  MD_REQUIRE(vocab >= 1 && vocab < (1 << kSampleKeyIdxBits), "sample_tokens: vocab ", vocab, " outside 1..2^23-1");
  MD_REQUIRE(logits_stride >= vocab, "sample_tokens: logits_stride < vocab");
  MD_REQUIRE(n_rows >= 0 && n_rows <= 65535, "sample_tokens: n_rows ", n_rows);
  MD_REQUIRE(threads == 256 || threads == 1024, "sample_tokens: threads ", threads, " not 256 or 1024");
  MD_REQUIRE((mask_slots == nullptr) == (masks == nullptr), "sample_tokens: mask_slots and masks go together");
  if (n_rows == 0) return;
  if (threads == 256) {
    sample_kernel<256><<<n_rows, 256, 0, stream>>>(logits, logits_stride, vocab, params, positions, tokens, mask_slots,
                                                   masks);
  } else {
    sample_kernel<1024><<<n_rows, 1024, 0, stream>>>(logits, logits_stride, vocab, params, positions, tokens,
                                                     mask_slots, masks);
  }
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda
