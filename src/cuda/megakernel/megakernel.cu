// Instantiations and launcher of the megakernel (megakernel.cuh): one kernel per token-group
// count (batch <= 8, 16, 32, 64) and attention implementation (the tensor-core item's kernel has
// its own code and a larger scratch: fewer page-ring slots), each configured once per process.
#include <algorithm>
#include <mutex>

#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/megakernel/launch.h"
#include "cuda/megakernel/megakernel.cuh"

namespace megadecode::cuda {
namespace {

int token_groups(int batch) { return batch <= 8 ? 1 : batch <= 16 ? 2 : batch <= 32 ? 4 : 8; }

struct Configured {
  MkLaunchShape shape{};
  int n_sms = 0;
  int blocks_per_sm = 0;
};

template <int kNT, bool kTcAttn>
const Configured& configure() {
  static std::once_flag once;
  static Configured c;
  std::call_once(once, [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&c.n_sms, cudaDevAttrMultiProcessorCount, dev));
    using S = mk::MkSmem<kNT, kTcAttn>;
    const int slots = std::min(mk::kMaxPages, (optin - S::kPagesOffset) / S::kPageBytes);
    MD_REQUIRE(slots >= 2, "megakernel: ", optin, " bytes of shared memory hold fewer than 2 pages of ",
               S::kPageBytes, " bytes");
    c.shape = MkLaunchShape{kNT, slots, S::kPageBytes, S::kPagesOffset + slots * S::kPageBytes};
    CUDA_CHECK(cudaFuncSetAttribute(mk::megakernel<kNT, kTcAttn>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    c.shape.smem_bytes));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c.blocks_per_sm, mk::megakernel<kNT, kTcAttn>, mk::kThreads,
                                                             c.shape.smem_bytes));
  });
  return c;
}

template <int kNT, bool kTcAttn>
void launch(const MkParams& params, cudaStream_t stream) {
  const Configured& c = configure<kNT, kTcAttn>();
  const int grid = params.plan.shape.n_sms;
  MD_REQUIRE(c.blocks_per_sm >= 1 && grid <= c.n_sms * c.blocks_per_sm, "megakernel: a grid of ", grid,
             " persistent CTAs cannot all be resident (", c.n_sms, " SMs x ", c.blocks_per_sm,
             " CTA per SM); refusing to launch a kernel that would deadlock");
  mk::megakernel<kNT, kTcAttn><<<grid, mk::kThreads, c.shape.smem_bytes, stream>>>(params, c.shape.page_slots);
  CUDA_CHECK_LAST();
}

template <bool kTcAttn>
MkLaunchShape shape_for(int batch) {
  switch (token_groups(batch)) {
    case 1: return configure<1, kTcAttn>().shape;
    case 2: return configure<2, kTcAttn>().shape;
    case 4: return configure<4, kTcAttn>().shape;
    default: return configure<8, kTcAttn>().shape;
  }
}

template <bool kTcAttn>
void launch_for(const MkParams& params, cudaStream_t stream) {
  switch (token_groups(params.plan.shape.batch)) {
    case 1: return launch<1, kTcAttn>(params, stream);
    case 2: return launch<2, kTcAttn>(params, stream);
    case 4: return launch<4, kTcAttn>(params, stream);
    default: return launch<8, kTcAttn>(params, stream);
  }
}

}  // namespace

MkLaunchShape megakernel_shape(int batch, int32_t attn_impl) {
  return attn_impl == kMkAttnTc ? shape_for<true>(batch) : shape_for<false>(batch);
}

void launch_megakernel(const MkParams& params, cudaStream_t stream) {
  const int batch = params.plan.shape.batch;
  MD_REQUIRE(batch >= 1 && batch <= kGemmMaxTokens, "megakernel: batch ", batch, " outside 1..", kGemmMaxTokens);
  MD_REQUIRE(params.attn_impl == kMkAttnScalar || params.attn_impl == kMkAttnTc, "megakernel: unknown attention ",
             "implementation ", params.attn_impl);
  MD_REQUIRE(params.attn_impl != kMkAttnTc || (params.attn_terms >= 1 && params.attn_terms <= mk::kAttnMaxTerms),
             "megakernel: tensor-core attention with ", params.attn_terms, " bf16 terms (1..", mk::kAttnMaxTerms, ")");
  return params.attn_impl == kMkAttnTc ? launch_for<true>(params, stream) : launch_for<false>(params, stream);
}

}  // namespace megadecode::cuda
