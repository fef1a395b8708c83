// The CUDA backends on the asynchronous API (engine/backend.h: decode_async, collect; ctest label
// gpu from the `_gpu` suffix):
// 1. Steps chained on the device: on cuda-mk, cuda-ops, cuda-batched and cuda (whose path policy
//    flips between the steps), a run of decode_async steps whose rows take the previous step's
//    tokens on the device (prev_row, in a shuffled row order, two steps in flight) gives bitwise the
//    tokens and logits of the same steps run one at a time with the host feeding each token back;
//    a step with a penalised row (finished inside decode_async) and steps with logits and logprobs
//    among them; the device's logprobs (row_logprobs) match the host's from the same logits.
// 2. The engine: the Scheduler's overlapped loop (Overlap::kAuto: the CUDA backends run
//    asynchronously) against the plain loop on the tiny model, every sampling mode, on cuda-mk,
//    cuda-batched and cuda: the same events for every sequence, steps chained, no KV block leaked
//    (overlap_harness.h, the CPU tests' harness).
#include <gtest/gtest.h>

#if defined(MEGADECODE_HAVE_CUDA)
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "../cuda/gpu_test_util.h"
#include "core/rng.h"
#include "cuda/backend/cuda_backend.h"
#include "engine/logits.h"
#include "model/presets.h"
#include "overlap_harness.h"

namespace megadecode {
namespace {

struct Seq {
  std::vector<int32_t> table;
  int pos = 0;
  int32_t token = 0;
  SamplingParams sampling;
  std::vector<int32_t> history;  // a penalised sequence's
};

// What one step gave, per sequence (not per row: the chained run shuffles the rows).
struct StepOut {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // empty unless the step asked for them
  std::vector<TokenLogprob> logprobs;      // empty unless a row asked
};

// Step s's row order: sequence order[s][r] in row r.
std::vector<std::vector<int>> row_orders(SplitMix64& rng, int n_seqs, int n_steps) {
  std::vector<std::vector<int>> order(n_steps, std::vector<int>(n_seqs));
  for (auto& o : order) {
    std::iota(o.begin(), o.end(), 0);
    for (int i = n_seqs - 1; i > 0; --i) std::swap(o[i], o[rng.below(i + 1)]);
  }
  return order;
}

DecodeSeq row_of(const Seq& s, int64_t id, const int32_t* token) {
  DecodeSeq d;
  d.chunk.seq_id = id;
  if (token) d.chunk.tokens = std::span<const int32_t>(token, 1);
  d.chunk.start_pos = s.pos;
  d.chunk.block_table = s.table;
  d.sampling = s.sampling;
  d.history = s.history;
  return d;
}

StepOut by_sequence(const DecodeResult& r, const std::vector<int>& order, int vocab) {
  StepOut o;
  o.tokens.assign(order.size(), -1);
  if (!r.logits.empty()) o.logits.resize(order.size());
  if (!r.logprobs.empty()) o.logprobs.resize(order.size());
  for (size_t row = 0; row < order.size(); ++row) {
    o.tokens[order[row]] = r.tokens[row];
    if (!r.logprobs.empty()) o.logprobs[order[row]] = r.logprobs[row];
    if (!r.logits.empty())
      o.logits[order[row]].assign(r.logits.begin() + row * vocab, r.logits.begin() + (row + 1) * vocab);
  }
  return o;
}

TEST(OverlapGpu, ChainedStepsGiveTheTokensOfStepsRunOneAtATime) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("tiny");
  SplitMix64 rng = testing::seeded_rng();
  std::shared_ptr<cuda::DeviceWeights> w = cuda::DeviceWeights::synthetic(c, rng.next());
  const int kSteps = 7, kBlock = 16;
  for (const char* backend : {"cuda-mk", "cuda-ops", "cuda-batched", "cuda"}) {
    for (int n_seqs : {1, 5}) {
      BackendOptions o;
      o.backend = backend;
      o.kv_block_size = kBlock;
      o.n_kv_blocks = 600;
      o.prefill_chunk = 0;
      cuda::CudaBackend be(w, o);
      std::vector<Seq> start(n_seqs);
      int next_block = 0;
      for (int i = 0; i < n_seqs; ++i) {
        Seq& s = start[i];
        s.pos = static_cast<int>(rng.below(700));
        for (int b = 0; b < (s.pos + kSteps) / kBlock + 1; ++b) s.table.push_back(next_block++);
        s.token = static_cast<int32_t>(rng.below(c.vocab_size));
        s.sampling.temperature = i % 2 ? 0.8f : 0.0f;
        s.sampling.top_k = i % 3 == 2 ? 20 : 0;
        s.sampling.seed = rng.next();
      }
      const std::vector<std::vector<int>> order = row_orders(rng, n_seqs, kSteps);
      // Step 3 asks for logits and logprobs (0 to 20 top tokens); step 4 for logprobs alone; at step
      // 5 sequence 0 has a repetition penalty (its row never chains: the host samples it, so step 5
      // waits for step 4's tokens) and asks for 3 top logprobs (the host's, of its token).
      const int logits_step = 3, logprobs_step = 4, penalised_step = 5;
      auto logprobs_at = [&](int seq, int step) {
        if (step == logits_step || step == logprobs_step) return seq % 3 == 0 ? 20 : seq % 3 == 1 ? 0 : 1 + seq;
        return step == penalised_step && seq == 0 ? 3 : -1;
      };
      auto sampling_at = [&](const Seq& q, int seq, int step) {
        SamplingParams p = q.sampling;
        if (step == penalised_step && seq == 0) p.repetition_penalty = 1.4f;
        return p;
      };
      // cuda: the policy flips paths between steps (the same flips in both runs).
      auto set_policy = [&](int step) {
        if (std::string(backend) != "cuda") return;
        DecodePathPolicy p;
        p.batched_from_batch = step % 2 == 0 ? 1 : 64;
        be.set_path_policy(p);
      };
      const std::string what = cat(backend, ", ", n_seqs, " sequences");

      // One step at a time, each token fed back by the host.
      std::vector<StepOut> want;
      {
        std::vector<Seq> seqs = start;
        for (int s = 0; s < kSteps; ++s) {
          set_policy(s);
          std::vector<DecodeSeq> rows;
          for (int seq : order[s]) {
            rows.push_back(row_of(seqs[seq], seq, &seqs[seq].token));
            rows.back().sampling = sampling_at(seqs[seq], seq, s);
            rows.back().history = seqs[seq].history;
            rows.back().logprobs = logprobs_at(seq, s);
          }
          DecodeResult r;
          be.decode(rows, s == logits_step, r);
          want.push_back(by_sequence(r, order[s], c.vocab_size));
          for (int i = 0; i < n_seqs; ++i) {
            seqs[i].history.push_back(seqs[i].token);
            seqs[i].token = want.back().tokens[i];
            ++seqs[i].pos;
          }
        }
      }
      // The same steps chained: each row takes its sequence's token from the previous step's row on
      // the device, and step s + 1 is launched before step s is collected.
      std::vector<StepOut> got(kSteps);
      int n_overlapped = 0;
      {
        std::vector<Seq> seqs = start;
        int in_flight = -1;
        DecodeTicket ticket;
        auto collect = [&] {
          DecodeResult r;
          be.collect(ticket, r);
          got[in_flight] = by_sequence(r, order[in_flight], c.vocab_size);
          for (int i = 0; i < n_seqs; ++i) seqs[i].token = got[in_flight].tokens[i];
          in_flight = -1;
        };
        for (int s = 0; s < kSteps; ++s) {
          set_policy(s);
          const bool chained = s > 0 && s != penalised_step;
          if (!chained && in_flight >= 0) collect();  // the host needs its tokens
          std::vector<DecodeSeq> rows;
          for (int seq : order[s]) {
            Seq& q = seqs[seq];
            DecodeSeq d = row_of(q, seq, chained ? nullptr : &q.token);
            d.sampling = sampling_at(q, seq, s);
            d.history = q.history;
            d.logprobs = logprobs_at(seq, s);
            if (chained)
              d.prev_row = static_cast<int>(std::find(order[s - 1].begin(), order[s - 1].end(), seq) -
                                            order[s - 1].begin());
            rows.push_back(d);
          }
          const DecodeTicket next = be.decode_async(rows, s == logits_step);
          if (in_flight >= 0) {
            collect();
            ++n_overlapped;
          }
          ticket = next;
          in_flight = s;
          for (Seq& q : seqs) {
            q.history.push_back(q.token);  // as the reference's (only the penalised step reads it)
            ++q.pos;
          }
        }
        collect();
      }
      EXPECT_EQ(n_overlapped, kSteps - 2) << what;
      // The device's logprobs against the host's from the same logits (engine/logits.h).
      for (int i = 0; i < n_seqs; ++i) {
        const StepOut& w3 = want[logits_step];
        ASSERT_EQ(w3.logprobs.size(), static_cast<size_t>(n_seqs)) << what;
        const TokenLogprob host = token_logprob(w3.logits[i], w3.tokens[i], logprobs_at(i, logits_step));
        const TokenLogprob& dev = w3.logprobs[i];
        EXPECT_EQ(dev.token, host.token) << what << ", sequence " << i;
        EXPECT_NEAR(dev.logprob, host.logprob, 2e-5) << what << ", sequence " << i;
        ASSERT_EQ(dev.top.size(), host.top.size()) << what << ", sequence " << i;
        for (size_t k = 0; k < host.top.size(); ++k) {
          EXPECT_EQ(dev.top[k].token, host.top[k].token) << what << ", sequence " << i << ", top " << k;
          EXPECT_NEAR(dev.top[k].logprob, host.top[k].logprob, 2e-5) << what << ", sequence " << i << ", top " << k;
        }
      }
      ASSERT_EQ(want[penalised_step].logprobs.size(), static_cast<size_t>(n_seqs)) << what;
      EXPECT_EQ(want[penalised_step].logprobs[0].token, want[penalised_step].tokens[0]) << what;
      EXPECT_EQ(want[penalised_step].logprobs[0].top.size(), 3u) << what;
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_EQ(got[s].tokens, want[s].tokens) << what << ", step " << s;
        ASSERT_EQ(got[s].logprobs.size(), want[s].logprobs.size()) << what << ", step " << s;
        for (size_t i = 0; i < want[s].logprobs.size(); ++i) {
          const TokenLogprob &a = want[s].logprobs[i], &b = got[s].logprobs[i];
          EXPECT_EQ(b.token, a.token) << what << ", step " << s;
          EXPECT_EQ(b.logprob, a.logprob) << what << ", step " << s;
          ASSERT_EQ(b.top.size(), a.top.size()) << what << ", step " << s;
          for (size_t k = 0; k < a.top.size(); ++k) {
            EXPECT_EQ(b.top[k].token, a.top[k].token) << what << ", step " << s;
            EXPECT_EQ(b.top[k].logprob, a.top[k].logprob) << what << ", step " << s;
          }
        }
        ASSERT_EQ(got[s].logits.size(), want[s].logits.size()) << what << ", step " << s;
        for (int i = 0; i < static_cast<int>(want[s].logits.size()); ++i)
          EXPECT_EQ(std::memcmp(got[s].logits[i].data(), want[s].logits[i].data(), want[s].logits[i].size() * 4), 0)
              << what << ", step " << s << ", sequence " << i << ": logits differ";
      }
    }
  }
}

// The engine's overlapped loop on the CUDA backends against its plain loop. (Not `cuda`: its path
// follows the batch, and mixed steps ride by a controller that measures time, so the two loops'
// steps could run the same row on different paths.)
class OverlapGpuEngine : public ::testing::TestWithParam<testing::Mode> {};

TEST_P(OverlapGpuEngine, SameEventsAsThePlainLoop) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("tiny");
  SplitMix64 rng = testing::seeded_rng();
  std::shared_ptr<cuda::DeviceWeights> w = cuda::DeviceWeights::synthetic(c, rng.next());
  const testing::Mode mode = GetParam();
  for (const char* backend : {"cuda-mk", "cuda-batched"}) {
    testing::RunSetup setup;
    setup.scheduler.max_num_seqs = 1 + static_cast<int>(rng.below(8));
    setup.scheduler.max_prefill_tokens = 8 + static_cast<int>(rng.below(64));
    setup.scheduler.prefix_caching = rng.below(2) != 0;
    const std::vector<SequenceRequest> reqs = testing::workload(rng, mode, 4 + static_cast<int>(rng.below(5)));
    BackendOptions o;
    o.backend = backend;
    o.kv_block_size = 16;
    o.n_kv_blocks = 256;
    o.prefill_chunk = 64;
    testing::Outcome outs[2];
    for (int k = 0; k < 2; ++k) {
      cuda::CudaBackend be(w, o);
      testing::RunSetup s = setup;
      s.scheduler.overlap = k == 0 ? Overlap::kOff : Overlap::kAuto;
      outs[k] = testing::run(be, s, reqs);
      if (::testing::Test::HasFatalFailure()) return;
    }
    const std::string what = cat(backend, ", ", testing::mode_name(mode));
    testing::expect_same(outs[0], outs[1], what);
    EXPECT_EQ(outs[0].n_chained, 0u) << what;
    // Penalised rows are never chained; min_tokens rows only once past min_tokens, which one short
    // workload may not reach while another step is in flight (seed 7513454223968576606, cuda-batched:
    // none chained). test_scheduler_overlap holds those modes' chaining over several workloads.
    if (mode != testing::Mode::kPenalties && mode != testing::Mode::kMinTokens) {
      EXPECT_GT(outs[1].n_chained, 0u) << what << ": no step was chained";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, OverlapGpuEngine,
    ::testing::Values(testing::Mode::kGreedy, testing::Mode::kTemperature, testing::Mode::kTopK, testing::Mode::kTopP,
                      testing::Mode::kMinP, testing::Mode::kPenalties, testing::Mode::kMinTokens,
                      testing::Mode::kLogprobs, testing::Mode::kMixed),
    [](const ::testing::TestParamInfo<testing::Mode>& p) { return std::string(testing::mode_name(p.param)); });

}  // namespace
}  // namespace megadecode
#endif
