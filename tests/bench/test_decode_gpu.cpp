// GPU checks of the benchmark's kernel switches and trace (ctest label gpu, from the `_gpu`
// suffix; like every GPU test it fails without a GPU unless MEGADECODE_ALLOW_NO_GPU is set): on the
// `small` preset, every switch (the loader in order, the L2 prefetch, backed-off polls, the caps, the
// sampler's full argmax pass, the expert-down jobs split over the warps, the experts' pages uncapped, early
// or late) gives bitwise the logits and the same tokens (greedy rows and seeded draws) of the default kernel
// (they change only when work runs), and a traced step records exactly one work record per task
// (attention items are tasks) and exports to a Chrome trace.
#include <gtest/gtest.h>

#if defined(MEGADECODE_HAVE_CUDA)
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>

#include "../cuda/gpu_test_util.h"
#include "bench/decode_trace.h"
#include "core/rng.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/common/device_info.h"
#include "model/presets.h"

namespace megadecode {
namespace {

struct Batch {
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> tokens;
  std::vector<DecodeSeq> seqs;
};

Batch make_batch(SplitMix64& rng, const ModelConfig& c, int batch, int bs) {
  Batch b;
  b.tables.resize(batch);
  b.tokens.resize(batch);
  b.seqs.resize(batch);
  int next = 0;
  for (int i = 0; i < batch; ++i) {
    const int ctx = 1 + static_cast<int>(rng.below(3000));
    for (int j = 0; j < (ctx + bs - 1) / bs; ++j) b.tables[i].push_back(next++);
    b.tokens[i] = static_cast<int32_t>(rng.below(c.vocab_size));
    b.seqs[i].chunk.tokens = std::span<const int32_t>(&b.tokens[i], 1);
    b.seqs[i].chunk.start_pos = ctx - 1;
    b.seqs[i].chunk.block_table = b.tables[i];
    b.seqs[i].sampling.temperature = i % 3 == 1 ? 0.8f : 0.0f;  // greedy rows and seeded draws (top-p on some)
    b.seqs[i].sampling.top_p = i % 6 == 4 ? 0.9f : 1.0f;
    b.seqs[i].sampling.seed = 77 + i;
  }
  return b;
}

TEST(DecodeGpu, SwitchesKeepLogitsBitwiseAndTraceCoversEveryTask) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("small");
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::shared_ptr<cuda::DeviceWeights> w = cuda::DeviceWeights::synthetic(c, seed);
  SplitMix64 rng(seed);
  for (int batch : {1, 3, 17}) {
    const Batch b = make_batch(rng, c, batch, 16);
    std::vector<float> ref;
    std::vector<int32_t> ref_tokens;
    for (uint32_t flags : {0u, uint32_t{cuda::kMkLoaderInOrder}, uint32_t{cuda::kMkL2Prefetch},
                           uint32_t{cuda::kMkPollBackoff}, uint32_t{cuda::kMkKvPrefetch}, uint32_t{cuda::kMkInflight2},
                           uint32_t{cuda::kMkInflight3}, uint32_t{cuda::kMkInflightOff}, uint32_t{cuda::kMkSampleFullPass},
                           uint32_t{cuda::kMkDownSplitK}, uint32_t{cuda::kMkExpertsUncapped},
                           uint32_t{cuda::kMkDownUncapped}, uint32_t{cuda::kMkExpertsUncappedLate},
                           uint32_t{cuda::kMkLoaderInOrder | cuda::kMkL2Prefetch | cuda::kMkKvPrefetch}}) {
      BackendOptions o;
      o.backend = "cuda-mk";
      o.n_kv_blocks = 4000;
      o.kernel_flags = flags;
      cuda::CudaBackend be(w, o);
      if (flags == 0) be.probe().enable_trace(8192);
      DecodeResult r;
      be.decode(b.seqs, true, r);
      if (flags == 0) {
        ref = r.logits;
        ref_tokens = r.tokens;
        int64_t dropped = -1;
        const std::vector<TraceRecord> recs = be.probe().read_trace(&dropped);
        EXPECT_EQ(dropped, 0);
        const Plan& plan = be.probe().last_plan();
        std::map<int, int> work_per_task;
        int attn_items = 0;
        int routings = 0, up_shares = 0;
        for (const Task& t : plan.tasks) up_shares += t.op == static_cast<uint8_t>(Op::kExpertUp);
        for (const TraceRecord& t : recs) {
          ASSERT_TRUE(t.sm >= 0 && t.sm < plan.n_sms());
          ASSERT_LE(t.c_begin, t.c_end);
          ASSERT_LE(t.g_begin, t.g_end);
          routings += t.kind == kTraceLoader && t.arg0 == kLoaderRouting;
          if (t.kind != kTraceWork) continue;
          if (t.op == static_cast<int>(Op::kAttn)) ++attn_items;
          ++work_per_task[t.task];
        }
        EXPECT_EQ(attn_items, static_cast<int>(plan.attn_items.size()) * c.n_layers);
        for (size_t i = 0; i < plan.tasks.size(); ++i)  // one record per task, attention items included
          EXPECT_EQ(work_per_task[static_cast<int>(i)], 1) << describe_task(plan, static_cast<int>(i));
        EXPECT_EQ(work_per_task.size(), plan.tasks.size());
        EXPECT_EQ(routings, up_shares);  // every SM's loader routes each layer once, at its up share
        TraceSummary s;
        const nlohmann::json j = trace_to_chrome(recs, plan, dropped, {{"batch", batch}}, &s);
        EXPECT_GT(s.step_us, 0.0);
        EXPECT_GT(s.busy_frac, 0.0);
        EXPECT_GT(j["traceEvents"].size(), recs.size() / 2);
        std::printf("batch %d: %s", batch, format_trace_summary(s).c_str());
        // Replays: timed, the trace still there, the logits unchanged.
        const std::vector<float> ms = be.probe().time_last_step(1, 3);
        EXPECT_EQ(ms.size(), 3u);
        for (float m : ms) EXPECT_GT(m, 0.0f);
        EXPECT_FALSE(be.probe().read_trace().empty());
      } else {
        ASSERT_EQ(r.logits.size(), ref.size());
        EXPECT_EQ(std::memcmp(r.logits.data(), ref.data(), ref.size() * 4), 0) << "batch " << batch << " flags "
                                                                                 << flags;
        EXPECT_EQ(r.tokens, ref_tokens) << "batch " << batch << " flags " << flags;
      }
    }
  }
}

}  // namespace
}  // namespace megadecode
#endif  // MEGADECODE_HAVE_CUDA
