// GPU tests of the decode megakernel (cuda-mk) and its per-op baseline (cuda-ops) on the `small`
// preset (full widths, 128 experts, 2 layers): GPU synthetic weights equal the host checkpoint's;
// logits against the host reference for ragged batches over a shuffled, noise-filled paged cache;
// bitwise repeatability, batch invariance, cuda-ops == cuda-mk, every output written (NaN-poisoned
// buffers), planned counter totals reached, seeded sampling, and a stuck counter reported by name.

#include <cstring>
#include <memory>
#include <string>

#include "core/check.h"
#include "model/loader.h"
#include "model/presets.h"
#include "plan/planner.h"
#include "plan/policy.h"
#include "sampling/host_sampler.h"
#include "../test_megakernel_util.h"

namespace megadecode::test {
namespace {

constexpr double kTol = 1e-2;

std::unique_ptr<cuda::CudaBackend> backend(bool per_op, int n_blocks = 16600) {
  BackendOptions o;
  o.backend = per_op ? "cuda-ops" : "cuda-mk";
  o.n_kv_blocks = n_blocks;
  o.kv_block_size = 16;
  auto be = std::make_unique<cuda::CudaBackend>(small().dev, o);
  be->probe().set_poison_activations(true);
  return be;
}

TEST(DeviceWeights, SyntheticEqualsUploadedCheckpointBitwise) {
  const ModelConfig c = preset_config("tiny");
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  LoadedModel host = synthetic_model(c, seed);
  auto a = cuda::DeviceWeights::synthetic(c, seed);
  auto b = cuda::DeviceWeights::upload(c, host.weights);
  ASSERT_EQ(a->bytes(), b->bytes());
  std::vector<uint8_t> ha(a->bytes()), hb(b->bytes());
  ASSERT_EQ(cudaMemcpy(ha.data(), a->arena(), ha.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(hb.data(), b->arena(), hb.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.size()), 0);
}

// Routing-exact against cpu-ref with the device's rounding points (routing_exact.h): near-tie
// bound kRouteNearTie, then every row within kTol with the device's routing forced.
TEST(Megakernel, MatchesReferenceRaggedBatches) {
  Small& s = small();
  auto be = backend(false, 16600);
  const uint64_t case_seed = test_seed();
  std::printf("case seed %llu (MEGADECODE_SEED reproduces weights and cases)\n", static_cast<unsigned long long>(case_seed));
  SplitMix64 rng(case_seed);
  const std::vector<int> batches = gpu_quick() ? std::vector<int>{1, 17, 64} : std::vector<int>{1, 3, 8, 17, 64};
  for (int batch : batches) {
    const int max_ctx = batch == 64 ? 1024 : 4096;
    Case k = make_case(s.config, *be, rng, batch, max_ctx, {batch == 64 ? 4096 : 1, 97, 16, 17});
    std::vector<int32_t> tokens;
    RoutingLog routing;
    const std::vector<float> dev = run_case(*be, k, &tokens, &routing);
    const std::string counters = be->probe().check_counter_totals();
    EXPECT_EQ(counters, "") << "batch " << batch;
    RoutingAudit audit;
    const auto ref = cpu_ref_step(s.config, s.host.weights, k, be->n_kv_blocks(), routing, true, audit);
    expect_routing_exact(audit, static_cast<int64_t>(batch) * s.config.n_layers, kRouteNearTie,
                         "batch " + std::to_string(batch));
    const Compare cmp = compare(dev, ref, tokens, s.config.vocab_size, kTol);
    std::printf("batch %2d: max |err| / max |ref| = %.3g (max |ref| %.3g), %d rows over the bound, %d token mismatches\n",
                batch, cmp.max_err, cmp.max_ref, cmp.n_bad, cmp.token_mismatch);
    for (int b : cmp.bad_seqs) {
      const AttnSplit sp = attn_split_for(k.seqs[b].n_ctx, policy_by_name("default"), 16);
      std::printf("  row %d over the bound: context %d, %d splits of %d tokens\n", b, k.seqs[b].n_ctx, sp.n_splits, sp.len);
    }
    EXPECT_EQ(cmp.n_nan, 0) << "batch " << batch << ": unwritten (NaN) logits";
    EXPECT_EQ(cmp.n_bad, 0) << "batch " << batch;
    EXPECT_EQ(cmp.token_mismatch, 0) << "batch " << batch;
  }
}

TEST(Megakernel, RepeatedRunsAreBitwiseIdentical) {
  Small& s = small();
  auto be = backend(false, 16600);
  SplitMix64 rng(test_seed());
  Case k = make_case(s.config, *be, rng, 17, 3000);
  const std::vector<float> a = run_case(*be, k);
  const std::vector<float> b = run_case(*be, k);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

// cuda-ops runs the same tile code one wave per launch (no cross-op overlap): equal bits.
TEST(Megakernel, CudaOpsEqualsMegakernelBitwise) {
  Small& s = small();
  auto mk = backend(false, 16600), ops = backend(true, 16600);
  SplitMix64 rng(test_seed());
  for (int batch : {1, 8, 33}) {
    Case k = make_case(s.config, *mk, rng, batch, 2048);
    const std::vector<float> a = run_case(*mk, k);
    const std::vector<float> b = run_case(*ops, k);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "batch " << batch;
    EXPECT_EQ(ops->probe().check_counter_totals(), "") << "batch " << batch;
  }
}

// A sequence's logits must not depend on its batch or its place in it, at contexts up to 4096
// (up to 16 attention splits: the split geometry comes from the sequence's own length).
TEST(Megakernel, BatchInvariance) {
  Small& s = small();
  auto be = backend(false, 16600);
  SplitMix64 rng(test_seed());
  const int V = s.config.vocab_size;
  Case big = make_case(s.config, *be, rng, 64, 4096);
  const std::vector<float> all = run_case(*be, big);
  for (int probe : {0, 5, 63}) {
    for (int batch : {1, 8}) {
      Case k = big;
      const int start = std::max(0, std::min(probe, 64 - batch));
      k.seqs.assign(big.seqs.begin() + start, big.seqs.begin() + start + batch);
      k.sampling.assign(big.sampling.begin() + start, big.sampling.begin() + start + batch);
      const std::vector<float> part = run_case(*be, k);
      const int at = probe - start;
      EXPECT_EQ(std::memcmp(part.data() + static_cast<size_t>(at) * V, all.data() + static_cast<size_t>(probe) * V, V * 4), 0)
          << "sequence " << probe << " alone/in a batch of " << batch << " differs from the batch of 64";
    }
  }
}

// 64 copies of one sequence (one token, the same cached keys and values, each copy in its own
// blocks): every expert the sequence picks gets all 64 tokens, more rows than the expert-down
// activation area holds at 64 tokens (42 at the whole moe_intermediate), so those experts' jobs go
// in chunks (plan/gemm_geometry.h down_walk_next). Every row must equal the sequence alone, bitwise.
TEST(Megakernel, OneSequenceSixtyFourTimesEqualsItAlone) {
  Small& s = small();
  auto be = backend(false, 16600);
  SplitMix64 rng(test_seed());
  const int V = s.config.vocab_size, bs = be->kv_block_size(), nb = be->n_kv_blocks();
  const int64_t block_elems = static_cast<int64_t>(s.config.n_kv_heads) * bs * s.config.head_dim;
  Case many = make_case(s.config, *be, rng, 64, 1, std::vector<int>(64, 700));
  for (CaseSeq& q : many.seqs) {
    q.token = many.seqs[0].token;
    for (size_t b = 0; b < q.table.size(); ++b)
      for (int L = 0; L < s.config.n_layers; ++L)
        for (int kvi = 0; kvi < 2; ++kvi) {
          const int64_t plane = static_cast<int64_t>(L * 2 + kvi) * nb;
          std::copy_n(many.kv.begin() + (plane + many.seqs[0].table[b]) * block_elems, block_elems,
                      many.kv.begin() + (plane + q.table[b]) * block_elems);
        }
  }
  RoutingLog routing;
  const std::vector<float> all = run_case(*be, many, nullptr, &routing);
  // The premise: all 64 copies chose the same experts (64 tokens each, over the area's 42 rows).
  const TokenRouting* first = routing.find(0, 699);
  ASSERT_NE(first, nullptr);
  for (int i = 1; i < 64; ++i) {
    const TokenRouting* r = routing.find(i, 699);
    ASSERT_NE(r, nullptr);
    ASSERT_EQ(r->experts, first->experts) << "copy " << i;
  }
  Case one = many;
  one.seqs.resize(1);
  one.sampling.resize(1);
  const std::vector<float> alone = run_case(*be, one);
  for (int i = 0; i < 64; ++i)
    ASSERT_EQ(std::memcmp(all.data() + static_cast<size_t>(i) * V, alone.data(), V * 4), 0)
        << "copy " << i << " of the sequence differs from it alone";
  EXPECT_EQ(be->probe().check_counter_totals(), "");
}

TEST(Megakernel, SeededSamplingIsReproducible) {
  Small& s = small();
  auto be = backend(false);
  SplitMix64 rng(test_seed());
  Case k = make_case(s.config, *be, rng, 8, 500);
  for (size_t i = 0; i < k.sampling.size(); ++i) {
    SamplingParams& sp = k.sampling[i];
    sp.temperature = 0.7f + 0.1f * static_cast<float>(i % 3);
    sp.top_k = i % 2 ? 40 : 0;
    sp.top_p = i % 4 < 2 ? 0.9f : 1.0f;
    sp.min_p = i == 3 ? 0.05f : 0.0f;
    sp.seed = 1234 + i;
  }
  k.sampling[7].temperature = 0.0f;  // greedy row
  std::vector<int32_t> t1, t2;
  const std::vector<float> logits = run_case(*be, k, &t1);
  run_case(*be, k, &t2);
  EXPECT_EQ(t1, t2);
  const int V = s.config.vocab_size;
  const float* row = logits.data() + static_cast<size_t>(7) * V;
  EXPECT_EQ(t1[7], std::max_element(row, row + V) - row);
  for (size_t i = 0; i < t1.size(); ++i) {
    ASSERT_GE(t1[i], 0);
    ASSERT_LT(t1[i], V);
    const float* r = logits.data() + i * V;
    const float mx = *std::max_element(r, r + V);
    EXPECT_GT(r[t1[i]], mx - 20.0f) << "row " << i << " sampled a token far out of the distribution";
  }
  // The same sequence alone samples the same token (seed + position pick the randomness).
  Case one = k;
  one.seqs.assign(k.seqs.begin() + 2, k.seqs.begin() + 3);
  one.sampling.assign(k.sampling.begin() + 2, k.sampling.begin() + 3);
  std::vector<int32_t> t3;
  run_case(*be, one, &t3);
  EXPECT_EQ(t3[0], t1[2]);
}

// Penalties need the token history, so penalised sequences are sampled by the host sampler from
// the device's logits; the others keep the device's token; the logits are the raw ones.
TEST(Megakernel, PenalisedSequencesAreSampledFromTheirHistory) {
  Small& s = small();
  auto be = backend(false);
  SplitMix64 rng(test_seed());
  const int V = s.config.vocab_size;
  Case k = make_case(s.config, *be, rng, 5, 300);
  std::vector<int32_t> plain;
  const std::vector<float> raw = run_case(*be, k, &plain);
  std::vector<DecodeSeq> ds = decode_seqs(k);
  // Sequence 1: the greedy token sits in the prompt, repetition penalty 5. Sequence 3: it was
  // generated twice, presence 2 + frequency 1, sampled at temperature 0.8 with a seed.
  const std::vector<int32_t> h1{static_cast<int32_t>(rng.below(V)), plain[1]};
  const std::vector<int32_t> h3{static_cast<int32_t>(rng.below(V)), plain[3], plain[3]};
  ds[1].sampling.repetition_penalty = 5.0f;
  ds[1].history = h1;
  ds[1].history_prompt_len = 2;
  ds[3].sampling.presence_penalty = 2.0f;
  ds[3].sampling.frequency_penalty = 1.0f;
  ds[3].sampling.temperature = 0.8f;
  ds[3].sampling.seed = 99;
  ds[3].history = h3;
  ds[3].history_prompt_len = 1;
  ASSERT_EQ(cudaMemcpy(be->kv_cache(), k.kv.data(), k.kv.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  DecodeResult r;
  be->decode(ds, true, r);
  ASSERT_EQ(r.logits.size(), raw.size());
  EXPECT_EQ(std::memcmp(r.logits.data(), raw.data(), raw.size() * 4), 0) << "penalties must not change the raw logits";
  for (int i : {0, 2, 4}) EXPECT_EQ(r.tokens[i], plain[i]) << "unpenalised sequence " << i;
  for (int i : {1, 3}) {
    const std::span<const float> row(raw.data() + static_cast<size_t>(i) * V, V);
    const sampling::TokenHistory h{ds[i].history.first(ds[i].history_prompt_len), ds[i].history.subspan(ds[i].history_prompt_len)};
    const int32_t want = sampling::sample_token(row, ds[i].sampling, ds[i].chunk.start_pos + 1, h);
    EXPECT_EQ(r.tokens[i], want) << "penalised sequence " << i;
    if (i == 1) EXPECT_NE(want, plain[1]) << "the test's repetition penalty did not move the greedy token";
  }
  // Without logits asked for, the row is read back all the same.
  DecodeResult r2;
  be->decode(ds, false, r2);
  EXPECT_EQ(r2.tokens, r.tokens);
}

TEST(Megakernel, StuckCounterEndsTheStepWithItsName) {
  Small& s = small();
  BackendOptions o;
  o.backend = "cuda-mk";
  o.n_kv_blocks = 1024;
  o.wait_timeout_ms = 200;
  cuda::CudaBackend be(s.dev, o);
  SplitMix64 rng(test_seed());
  Case k = make_case(s.config, be, rng, 3, 300);
  run_case(be, k);  // plan of this batch shape
  int victim = -1;
  const Plan& plan = be.probe().last_plan();
  for (size_t i = 0; i < plan.tasks.size() && victim < 0; ++i)
    if (plan.tasks[i].op == static_cast<uint8_t>(Op::kOProj) && plan.tasks[i].layer == 1) victim = static_cast<int>(i);
  ASSERT_GE(victim, 0);
  const std::string name = counter_name(plan, plan.tasks[victim].wait[0].counter);
  be.probe().set_stuck_task(victim);
  try {
    run_case(be, k);
    FAIL() << "a step with an unsatisfiable wait returned";
  } catch (const Error& e) {
    const std::string msg = e.what();
    std::printf("%s\n", msg.c_str());
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
  }
  be.probe().set_stuck_task(-1);
  const std::vector<float> again = run_case(be, k);  // the next step runs normally
  for (float v : again) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace megadecode::test
