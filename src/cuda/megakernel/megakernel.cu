// Instantiations and launcher of the megakernel (megakernel.cuh): one kernel per token-group count
// (batch <= 8, 16, 32, 64), each configured once per process (shared memory: smem.cuh, the ring
// takes what the rest leaves).
#include <algorithm>
#include <mutex>

#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_info.h"
#include "cuda/megakernel/launch.h"
#include "cuda/megakernel/megakernel.cuh"

namespace megadecode::cuda {
namespace {

struct Configured {
  MkLaunchShape shape{};
  int n_sms = 0;
  int blocks_per_sm = 0;
};

template <int kNT>
const Configured& configure() {
  static std::once_flag once;
  static Configured c;
  std::call_once(once, [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    c.n_sms = sm_count();
    using S = mk::Smem<kNT>;
    const int slots = std::min(mk::kMaxSlots, (optin - S::kRingOffset) / kPageBytes);
    MD_REQUIRE(slots >= 2, "megakernel: ", optin, " bytes of shared memory hold fewer than 2 pages of ",
               kPageBytes, " bytes after ", S::kRingOffset, " bytes of scratch");
    c.shape = MkLaunchShape{kNT, slots, kPageBytes, S::kRingOffset + slots * kPageBytes, S::kActBytes};
    CUDA_CHECK(cudaFuncSetAttribute(mk::megakernel<kNT>, cudaFuncAttributeMaxDynamicSharedMemorySize, c.shape.smem_bytes));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c.blocks_per_sm, mk::megakernel<kNT>, mk::kThreads,
                                                             c.shape.smem_bytes));
  });
  return c;
}

template <int kNT>
void launch(const MkParams& in, cudaStream_t stream) {
  const Configured& c = configure<kNT>();
  MkParams params = in;
  gemm_geometry(params.plan.shape, megakernel_layout(kNT), params.geo);  // = Smem<kNT> (smem.cuh)
  const int grid = params.plan.shape.n_sms;
  MD_REQUIRE(c.blocks_per_sm >= 1 && grid <= c.n_sms * c.blocks_per_sm, "megakernel: a grid of ", grid,
             " persistent CTAs cannot all be resident (", c.n_sms, " SMs x ", c.blocks_per_sm,
             " CTA per SM); refusing to launch a kernel that would deadlock");
  mk::megakernel<kNT><<<grid, mk::kThreads, c.shape.smem_bytes, stream>>>(params, c.shape.page_slots);
  CUDA_CHECK_LAST();
}

}  // namespace

MkLaunchShape megakernel_shape(int batch) {
  switch (token_groups(batch)) {
    case 1: return configure<1>().shape;
    case 2: return configure<2>().shape;
    case 4: return configure<4>().shape;
    default: return configure<8>().shape;
  }
}

void check_megakernel_shape(const PlanShape& s) {
  MD_REQUIRE(s.batch >= 1 && s.batch <= mk::kMaxBatch, "megakernel: batch ", s.batch, " outside 1..", mk::kMaxBatch);
  const auto pow2 = [](int x) { return x >= 1 && (x & (x - 1)) == 0; };
  MD_REQUIRE(s.group_size <= mk::kAttnMaxGroup && s.head_dim >= 16 && s.head_dim <= mk::kAttnMaxDim && pow2(s.head_dim),
             "megakernel: attention needs <= ", mk::kAttnMaxGroup, " q heads per KV head and a head dim of 16, 32, 64 or ",
             mk::kAttnMaxDim, "; the model has ", s.group_size, " and ", s.head_dim);
  MD_REQUIRE(pow2(s.kv_block_size), "megakernel: the KV block size must be a power of two, got ", s.kv_block_size);
  MD_REQUIRE(s.n_experts <= mk::kMaxExperts && s.top_k <= mk::kMaxTopK, "megakernel: routing needs <= ",
             mk::kMaxExperts, " experts and top-k <= ", mk::kMaxTopK, "; the model has ", s.n_experts, " and ", s.top_k);
  MD_REQUIRE(s.hidden % 128 == 0, "megakernel: the hidden size must be a multiple of 128, got ", s.hidden);
  MD_REQUIRE(s.dense_inter % 16 == 0 && (s.dense_inter == 0 || s.parallel),
             "megakernel: a dense FFN needs parallel blocks and an intermediate size that is a multiple of 16, got ",
             s.dense_inter, s.parallel ? "" : " in a sequential-block plan");
  MD_REQUIRE(s.shared_inter == 0, "megakernel: shared experts (a plan of width ", s.shared_inter,
             ") are not implemented on the device; use backend cpu-mk");
  const MkLaunchShape sh = megakernel_shape(s.batch);
  // The expert-down jobs hold one activation row of the whole moe_intermediate at least (an
  // expert's tokens beyond what the area holds go in chunks: plan/gemm_geometry.h down_walk_next),
  // and at one token group every token of the batch (an expert has at most one row per token;
  // that instantiation walks no chunks: ops.cuh JobWalk::next).
  const int64_t down_rows = sh.act_bytes / ((static_cast<int64_t>(s.moe_inter) + kActPad) * 2);
  MD_REQUIRE(down_rows >= (sh.token_groups == 1 ? s.batch : 1), "megakernel: moe_intermediate ", s.moe_inter,
             " does not fit the activation area (", down_rows, " rows of it at batch ", s.batch, ")");
}

void check_megakernel_tasks(std::span<const Task> tasks) {
  for (size_t i = 0; i < tasks.size(); ++i) {
    const Task& t = tasks[i];
    MD_REQUIRE(t.op < kNumOps, "megakernel: task ", i, " has op ", static_cast<int>(t.op), ", not an op of the plan");
    const Op op = static_cast<Op>(t.op);
    MD_REQUIRE(megakernel_runs(op), "megakernel: task ", i, " is ", op_name(op), " (layer ", t.layer,
               "), an op the megakernel does not run yet");
    // ATTN items may skip RoPE (kAttnNoRope) and read a sliding layer's ring (kAttnSliding); a
    // down share may meet its last wait at its first combine (kLastWaitAtWrite).
    const uint8_t runs = op == Op::kAttn ? kAttnNoRope | kAttnSliding : op == Op::kExpertDown ? kLastWaitAtWrite : 0;
    MD_REQUIRE((t.flags & ~runs) == 0, "megakernel: task ", i, " (", op_name(op), ", layer ", t.layer, ") has flags ",
               static_cast<int>(t.flags), ": the megakernel does not implement them");
  }
}

void launch_megakernel(const MkParams& params, cudaStream_t stream) {
  check_megakernel_shape(params.plan.shape);
  // Sliding-window items read and append through the ring pool: a plan with rings needs one.
  MD_REQUIRE(params.plan.shape.ring_len == 0 || (params.kv_ring != nullptr && params.kv_ring_layer_stride > 0),
             "megakernel: the plan has sliding-window layers (rings of ", params.plan.shape.ring_len,
             " blocks) but the launch has no KV ring pool");
  switch (token_groups(params.plan.shape.batch)) {
    case 1: return launch<1>(params, stream);
    case 2: return launch<2>(params, stream);
    case 4: return launch<4>(params, stream);
    default: return launch<8>(params, stream);
  }
}

}  // namespace megadecode::cuda
