// GPU checks of the benchmark's kernel switches and trace (ctest label gpu, from the `_gpu`
// suffix; like every GPU test it fails without a GPU unless MEGADECODE_ALLOW_NO_GPU is set): on the
// `small` preset, every switch (the loader in order, the L2 prefetch, backed-off polls, the caps, the
// sampler's full argmax pass, the expert-down jobs split over the warps, the experts' pages uncapped, early
// or late) gives bitwise the logits and the same tokens (greedy rows and seeded draws) of the default kernel
// (they change only when work runs), and a traced step records exactly one work record per task
// (attention items are tasks) and exports to a Chrome trace. Token masks (structured output) on
// every device path (cuda-mk, cuda-ops, cuda-batched): a constrained row samples only allowed tokens,
// exactly the host sampler's token under its mask on the step's logits (greedy, seeded draws with
// top-k / top-p / min-p, a penalised row resampled on the host), unconstrained rows of the same
// batch keep their tokens, and masks that allow everything change no token or logit.
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
#include "sampling/host_sampler.h"
#include "sampling/token_mask.h"

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

// A random mask of `vocab` tokens allowing a share `density` (at least token `keep` when >= 0) and
// never token `drop` (when >= 0 and other than keep).
std::vector<uint32_t> random_mask(SplitMix64& rng, int vocab, float density, int32_t keep, int32_t drop) {
  std::vector<uint32_t> m(token_mask_words(vocab), 0u);
  for (int t = 0; t < vocab; ++t)
    if (rng.unit() < density) m[t >> 5] |= 1u << (t & 31);
  if (drop >= 0) m[drop >> 5] &= ~(1u << (drop & 31));
  if (keep < 0 || keep == drop) keep = (drop + 1 + static_cast<int32_t>(rng.below(vocab - 1))) % vocab;
  m[keep >> 5] |= 1u << (keep & 31);
  return m;
}

TEST(DecodeGpu, TokenMasksOnEveryPath) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("small");
  const int V = c.vocab_size;
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::shared_ptr<cuda::DeviceWeights> w = cuda::DeviceWeights::synthetic(c, seed);
  SplitMix64 rng(seed);
  for (const char* backend : {"cuda-mk", "cuda-ops", "cuda-batched"}) {
    BackendOptions o;
    o.backend = backend;
    o.n_kv_blocks = 4000;
    o.prefill_chunk = 0;
    cuda::CudaBackend be(w, o);
    for (int batch : {1, 5, 17}) {
      Batch b = make_batch(rng, c, batch, 16);
      std::vector<std::vector<int32_t>> histories(batch);
      for (int i = 0; i < batch; ++i) {  // every sampling mode among the rows
        SamplingParams& sp = b.seqs[i].sampling;
        if (i % 5 == 2) sp.top_k = 1 + static_cast<int>(rng.below(40));
        if (i % 5 == 3) sp.min_p = 0.1f;
        if (i % 7 == 5) {  // a penalised row: the host resamples it, under its mask
          sp.temperature = 0.7f;
          sp.repetition_penalty = 1.3f;
          for (int k = 0; k < 6; ++k) histories[i].push_back(static_cast<int32_t>(rng.below(V)));
          b.seqs[i].history = histories[i];
        }
      }
      const std::string what = cat(backend, " batch ", batch);
      DecodeResult free_run;
      be.decode(b.seqs, true, free_run);

      // Masks that allow everything: the same logits and tokens.
      const std::vector<uint32_t> all(token_mask_words(V), ~0u);
      Batch full = b;
      for (DecodeSeq& d : full.seqs) d.allowed = all;
      DecodeResult full_run;
      be.decode(full.seqs, true, full_run);
      EXPECT_EQ(full_run.tokens, free_run.tokens) << what << ", masks allowing everything";
      ASSERT_EQ(full_run.logits.size(), free_run.logits.size());
      EXPECT_EQ(std::memcmp(full_run.logits.data(), free_run.logits.data(), free_run.logits.size() * 4), 0) << what;

      // Random masks on most rows (batch 1: its one row), each without the row's free token, some
      // allowing a single token; the other rows unconstrained.
      for (int round = 0; round < 3; ++round) {
        Batch masked = b;
        std::vector<std::vector<uint32_t>> masks(batch);
        for (int i = 0; i < batch; ++i) {
          if (batch > 1 && rng.below(3) == 0) continue;
          const float density = round == 0 ? 0.0f : rng.unit();
          masks[i] = random_mask(rng, V, density, -1, free_run.tokens[i]);
          masked.seqs[i].allowed = masks[i];
        }
        DecodeResult r;
        be.decode(masked.seqs, true, r);
        ASSERT_EQ(r.tokens.size(), static_cast<size_t>(batch));
        for (int i = 0; i < batch; ++i) {
          const DecodeSeq& d = masked.seqs[i];
          const std::string row = cat(what, " round ", round, " row ", i);
          if (masks[i].empty()) {
            EXPECT_EQ(r.tokens[i], free_run.tokens[i]) << row << ": an unconstrained row changed";
            continue;
          }
          ASSERT_TRUE(r.tokens[i] >= 0 && r.tokens[i] < V) << row;
          EXPECT_TRUE(token_mask_allows(masks[i].data(), r.tokens[i])) << row << ": token " << r.tokens[i];
          const std::span<const float> logits(r.logits.data() + static_cast<size_t>(i) * V, V);
          const sampling::TokenHistory h{d.history.first(d.history_prompt_len), d.history.subspan(d.history_prompt_len)};
          EXPECT_EQ(r.tokens[i], sampling::sample_token(logits, d.sampling, d.chunk.start_pos + 1, h, masks[i])) << row;
        }
      }
    }
  }
}

}  // namespace
}  // namespace megadecode
#endif  // MEGADECODE_HAVE_CUDA
