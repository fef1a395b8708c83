// sanitize: thread
// cohere2_moe (North Mini Code) through the decode plan and cpu-mk: north-tiny's
// parallel blocks (QKV and router read one norm; x = (x + o) + F written by O-proj), sliding-window
// layers reading their window through the ring table, NoPE full layers, the dense first layer,
// sigmoid routing and logit_scale. Routing-exact against cpu-ref: cpu-mk's routing is recorded, a
// choice that differs from cpu-ref's own where cpu-ref's k-th/(k+1)-th gap is not a near-tie fails,
// and cpu-ref rerun on cpu-mk's routing must meet the tolerance on every row. Contexts wrap the
// ring several times; batch 1 and a batch of several sequences; bitwise repeatability (threads,
// delays, sequential) and batch invariance; negative controls (a window off by some keys, an
// unforced audit).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>

#include "../ref/north_scenario.h"
#include "../ref/ref_test_util.h"
#include "../engine/fakes.h"
#include "cli/backend_factory.h"
#include "cli/generate_loop.h"
#include "core/check.h"
#include "emu/emulator_backend.h"
#include "engine/metrics.h"
#include "engine/scheduler.h"
#include "kv/kv_cache.h"
#include "model/presets.h"
#include "model/routing.h"
#include "plan/policy.h"
#include "ref/ref_backend.h"

namespace megadecode {
namespace {

constexpr int kBlock = 4;

float max_abs(std::span<const float> x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

using test::expect_alone_rows_equal;
using test::expect_same_routing;
using test::moe_layers;
using test::north_alone;
using test::rel_err;
using test::with_window;
using Scenario = test::NorthScenario;
using RunResult = test::NorthRun;

Scenario make_scenario(const ModelConfig& c, SplitMix64& rng, int n_seqs, int min_prompt, int max_prompt, int n_steps) {
  return test::make_north_scenario(c, kBlock, rng, n_seqs, min_prompt, max_prompt, n_steps);
}

void run_scenario(const Scenario& sc, Backend& be, RunResult& out) { test::run_north_scenario(sc, be, out); }

BackendOptions options(const Scenario& sc, const std::string& backend, int threads) {
  BackendOptions o{.backend = backend, .kv_block_size = kBlock, .n_kv_blocks = sc.n_full, .n_threads = threads};
  o.n_ring_blocks = sc.n_ring;
  return o;
}

RunResult run_mk(const Scenario& sc, const test::TestWeights& w, int sms, uint64_t delay_seed, bool sequential,
                 int split_tokens, const std::string& policy = "default") {
  emu::EmulatorOptions eo;
  eo.delay_seed = delay_seed;
  eo.delay_probability = delay_seed ? 0.05 : 0.0;
  eo.sequential = sequential;
  BackendOptions o = options(sc, "cpu-mk", sms);
  o.policy = policy;
  emu::CpuMkBackend mk(sc.config, w.weights, w.store, o, eo);
  mk.policy().attn_min_split_tokens = split_tokens;  // several splits in the window and the full layers
  mk.kv_store().fill(NAN);
  RunResult r;
  r.log = RoutingLog(sc.config.n_layers, sc.config.n_experts_per_tok);
  mk.set_routing_record(&r.log);
  run_scenario(sc, mk, r);
  return r;
}

RunResult run_ref(const Scenario& sc, const test::TestWeights& w, const RoutingLog* forced, RoutingAudit* audit) {
  ref::RefBackend ref(sc.config, w.weights, w.store, options(sc, "cpu-ref", 2));
  ref.kv_store().fill(NAN);
  RunResult r;
  r.log = RoutingLog(sc.config.n_layers, sc.config.n_experts_per_tok);
  ref.set_routing_record(&r.log);
  if (forced) ref.set_forced_routing(forced, audit);
  run_scenario(sc, ref, r);
  return r;
}

// The routing-exact comparison of one scenario: cpu-mk's routing against cpu-ref's own, then cpu-ref
// forced with it, every row within tol of the reference's max |logit|.
void expect_routing_exact(const Scenario& sc, const test::TestWeights& w, const RunResult& mk, double tol) {
  RoutingAudit audit;
  const RunResult forced = run_ref(sc, w, &mk.log, &audit);
  int64_t tokens = 0;
  for (const auto& p : sc.prompts) tokens += static_cast<int64_t>(p.size());
  tokens += static_cast<int64_t>(sc.steps.size() * sc.prompts.size());
  ASSERT_EQ(static_cast<int64_t>(mk.log.size()), tokens) << "cpu-mk recorded the routing of every token";
  EXPECT_EQ(audit.n_forced, tokens * moe_layers(sc.config)) << "every MoE decision forced: " << audit.summary();
  EXPECT_TRUE(audit.beyond(kRouteNearTie).empty()) << "cpu-mk's routing differs beyond a near-tie: " << audit.summary();
  ASSERT_EQ(forced.rows.size(), mk.rows.size());
  for (size_t i = 0; i < mk.rows.size(); ++i) {
    const double e = rel_err(mk.rows[i], forced.rows[i]);
    EXPECT_LE(e, tol) << "row " << i << " of " << mk.rows.size();  // NaN fails too
  }
}

// One decode step of every token of `tokens` at position 0 (a sequence each, no prefill): the
// logits, [n, vocab].
std::vector<float> decode_at_position_zero(Backend& be, const Scenario& sc, const std::vector<int32_t>& tokens) {
  KvCache cache(sc.n_full, kBlock, false, sc.n_ring, sc.ring_len);
  std::vector<DecodeSeq> batch(tokens.size());
  for (size_t s = 0; s < tokens.size(); ++s) {
    const auto id = static_cast<int64_t>(s);
    cache.admit(id, cache.plan_admission(std::vector<int32_t>{tokens[s]}, 0, 1));
    EXPECT_TRUE(cache.ensure(id, 1));
    batch[s].chunk = SeqChunk{id, std::span<const int32_t>(&tokens[s], 1), 0, cache.table(id), cache.ring_table(id)};
    batch[s].sampling.temperature = 0;
  }
  DecodeResult r;
  be.decode(batch, true, r);
  return r.logits;
}

// A seeded case (the seed printed): north-tiny, its sliding window set to `window` (0: its own 24),
// with random bf16 weights.
struct NorthCase {
  uint64_t seed = test_seed();
  SplitMix64 rng{(std::printf("seed %llu\n", static_cast<unsigned long long>(seed)), seed)};
  ModelConfig c;
  test::TestWeights w;
  explicit NorthCase(int window)
      : c(window ? with_window(preset_config("north-tiny"), window) : preset_config("north-tiny")),
        w(test::random_weights(c, Dtype::kBF16, rng.next())) {}
};

TEST(NorthCpuMk, RoutingExactAgainstCpuRefAtBatchOneAndSeveralWrappingTheRing) {
  NorthCase k(0);  // window 24, 5 layers: dense + full RoPE, 3 sliding, full NoPE
  const ModelConfig& c = k.c;
  const test::TestWeights& w = k.w;
  SplitMix64& rng = k.rng;
  const uint64_t seed = k.seed;
  ASSERT_EQ(c.block, BlockKind::kParallel);
  ASSERT_EQ(c.router, RouterKind::kSigmoidTopK);
  ASSERT_NE(c.logit_scale, 1.0f);
  const int r = kv_ring_length(c.max_sliding_window(), kBlock);  // 7 blocks: 28 slots
  for (int batch : {1, 3}) {
    const std::string policy = policy_names()[rng.below(policy_names().size())];
    SCOPED_TRACE(cat("batch ", batch, " policy ", policy, " seed ", seed));
    // Prompts of 2.5..4 rings, 6 decode steps: the ring wraps 2-4 times.
    const Scenario sc = make_scenario(c, rng, batch, 5 * r * kBlock / 2, 4 * r * kBlock, 6);
    for (const auto& p : sc.prompts) ASSERT_GE(static_cast<int>(p.size()), 2 * r * kBlock);
    const RunResult mk = run_mk(sc, w, 1 + static_cast<int>(rng.below(8)), rng.next(), false, 8, policy);
    expect_routing_exact(sc, w, mk, 1e-5);
  }
}

// The comparison sees a window that is off: cpu-ref with a window 4 keys wider differs from cpu-mk
// (beyond the tolerance) at every row past the window, and agrees before (the first prompt rows).
TEST(NorthCpuMk, AWindowOffByFourKeysIsSeen) {
  NorthCase k(8);
  const ModelConfig& c = k.c;
  const test::TestWeights& w = k.w;
  SplitMix64& rng = k.rng;
  Scenario sc = make_scenario(c, rng, 2, 20, 30, 3);
  const RunResult mk = run_mk(sc, w, 3, 0, false, 8);
  Scenario wide = sc;
  wide.config = with_window(c, 12);
  wide.ring_len = kv_ring_length(12, kBlock);
  wide.n_ring = 2 * wide.ring_len + 1;
  const RunResult ref = run_ref(wide, w, nullptr, nullptr);
  ASSERT_EQ(ref.rows.size(), mk.rows.size());
  for (size_t i = 0; i < mk.rows.size(); ++i) EXPECT_GT(rel_err(mk.rows[i], ref.rows[i]), 1e-3) << "row " << i;
  // And with the same window the same comparison passes (the control of the control).
  const RunResult same = run_ref(sc, w, nullptr, nullptr);
  for (size_t i = 0; i < mk.rows.size(); ++i) EXPECT_LE(rel_err(mk.rows[i], same.rows[i]), 1e-4) << "row " << i;
}

// Bitwise: any SM count, random delays, the sequential wave order, or the ablation policies that
// only reorder the work (grid-sync, router-after-attn) give the same logits and the same routing;
// and each sequence alone gives its rows of the batch (batch invariance).
TEST(NorthCpuMk, BitwiseRepeatableAndBatchInvariant) {
  NorthCase k(12);
  const ModelConfig& c = k.c;
  const test::TestWeights& w = k.w;
  SplitMix64& rng = k.rng;
  const Scenario sc = make_scenario(c, rng, 4, 10, 60, 4);
  const RunResult a = run_mk(sc, w, 5, rng.next(), false, 8);
  const std::string reorder = rng.below(2) ? "grid-sync" : "router-after-attn";
  SCOPED_TRACE(reorder);
  const RunResult b = run_mk(sc, w, 1 + static_cast<int>(rng.below(16)), rng.next(), false, 8, reorder);
  const RunResult q = run_mk(sc, w, 7, 0, true, 8);
  const size_t V = c.vocab_size;
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i) {
    EXPECT_EQ(std::memcmp(a.rows[i].data(), b.rows[i].data(), V * 4), 0) << "row " << i << " (threads, delays)";
    EXPECT_EQ(std::memcmp(a.rows[i].data(), q.rows[i].data(), V * 4), 0) << "row " << i << " (sequential)";
  }
  expect_same_routing(a.log, b.log);
  // Each sequence alone: its prompt row, then its decode rows, bitwise those of the batch.
  const int n = static_cast<int>(sc.prompts.size());
  for (int s = 0; s < n; ++s) expect_alone_rows_equal(run_mk(north_alone(sc, s), w, 3, 0, false, 8), a, sc, s);
}

// At position 0 attention is exact on both sides (one key: the value itself), so every other step
// of the parallel block must be bitwise cpu-ref's: the input norm shared by QKV and router, sigmoid
// routing, the dense layer, x = (x + o) + F in that order, logit_scale. A batch of four sequences
// at position 0, decoded in one step.
TEST(NorthCpuMk, PositionZeroIsBitwiseCpuRef) {
  NorthCase k(0);
  const ModelConfig& c = k.c;
  const test::TestWeights& w = k.w;
  SplitMix64& rng = k.rng;
  Scenario sc = make_scenario(c, rng, 4, 1, 1, 0);
  // Decode at position 0: the prompts are the steps' tokens (no prefill).
  const int n = 4;
  const size_t V = c.vocab_size;
  std::vector<int32_t> tokens = test::random_tokens(rng, n, c.vocab_size);
  auto run = [&](Backend& be) { return decode_at_position_zero(be, sc, tokens); };
  emu::CpuMkBackend mk(c, w.weights, w.store, options(sc, "cpu-mk", 5));
  ref::RefBackend ref(c, w.weights, w.store, options(sc, "cpu-ref", 2));
  const std::vector<float> got = run(mk), want = run(ref);
  ASSERT_EQ(got.size(), n * V);
  ASSERT_EQ(want.size(), n * V);
  for (int s = 0; s < n; ++s) {
    EXPECT_EQ(std::memcmp(got.data() + s * V, want.data() + s * V, V * 4), 0) << "sequence " << s;
    EXPECT_GT(max_abs(std::span<const float>(want.data() + s * V, V)), 0.0f);
  }
}

// `generate --backend cpu-mk` on north-tiny: the factory's cpu-mk (its ring pool sized as cpu-ref's)
// and the generate loop's ring table; greedy tokens equal cpu-ref's past the window.
TEST(NorthCpuMk, FactoryAndGenerateLoopMatchCpuRef) {
  const ModelConfig c = with_window(preset_config("north-tiny"), 8);
  const test::TestWeights w = test::random_weights(c, Dtype::kBF16, 21);
  GenerateRequest request;
  request.prompt = {5, 17, 300, 42, 7, 9, 1000, 3, 12, 8};
  request.sampling.temperature = 0;
  request.max_tokens = 16;  // to position 26: the 8-key window's ring (R 3 of 4) wraps twice
  request.ignore_eos = true;
  BackendOptions options{.backend = "cpu-mk", .kv_block_size = 4, .n_kv_blocks = blocks_needed(request, 4),
                         .n_threads = 3};
  auto mk = make_backend(c, w.weights, w.store, options);
  options.backend = "cpu-ref";
  auto ref = make_backend(c, w.weights, w.store, options);
  const GenerateResult a = generate(*mk, request, [](int32_t) {});
  const GenerateResult b = generate(*ref, request, [](int32_t) {});
  ASSERT_EQ(a.tokens.size(), 16u);
  EXPECT_EQ(a.tokens, b.tokens);
}

// The engine's scheduler over cpu-mk with a ring pool that binds (room for about two rings of the
// cohere test shape's 5-key window at blocks of 2): chunked prompts, preemptions by the ring pool;
// every request's tokens equal those of the same schedule over cpu-ref (fixed seed: greedy tokens
// of a model whose margins are far above the two backends' difference).
TEST(NorthCpuMk, SchedulerWithABindingRingPoolMatchesCpuRef) {
  const ModelConfig c = test::cohere_config();
  const test::TestWeights w = test::random_weights(c, Dtype::kBF16, 77);
  const int bs = 2, r = kv_ring_length(c.max_sliding_window(), bs);
  auto run = [&](Backend& backend, size_t& preemptions) {
    EngineMetrics metrics;
    SchedulerConfig sc;
    sc.max_num_seqs = 4;
    sc.max_prefill_tokens = 7;
    sc.check_invariants = true;
    Scheduler sched(backend, sc, testing::fake_decoders(), &metrics);
    auto sink = std::make_shared<testing::CollectingSink>();
    SplitMix64 rng(5);
    const int prompt_len[] = {3, 4, 3, 20};
    for (uint64_t id = 1; id <= 4; ++id) {
      SequenceRequest req;
      req.request_id = id;
      req.prompt = test::random_tokens(rng, prompt_len[id - 1], c.vocab_size);
      req.sampling.temperature = 0;
      req.stop.max_tokens = 18;
      req.stop.ignore_eos = true;
      req.sink = sink;
      sched.add(std::move(req));
    }
    for (int i = 0; i < 10000 && sched.step(); ++i) EXPECT_LE(sched.kv().n_ring_used(), sched.n_running() * r);
    EXPECT_TRUE(sched.idle());
    preemptions = sched.n_preemptions();
    std::map<uint64_t, std::vector<int32_t>> tokens;
    for (const SeqOutput& o : sink->events) tokens[o.request_id].insert(tokens[o.request_id].end(), o.tokens.begin(), o.tokens.end());
    return tokens;
  };
  BackendOptions o{.backend = "cpu-mk", .kv_block_size = bs, .n_kv_blocks = 200, .n_threads = 3};
  o.n_ring_blocks = 2 * r + 1;
  emu::CpuMkBackend mk(c, w.weights, w.store, o);
  ASSERT_EQ(mk.n_ring_blocks(), 2 * r + 1);
  o.backend = "cpu-ref";
  ref::RefBackend ref(c, w.weights, w.store, o);
  size_t mk_pre = 0, ref_pre = 0;
  const auto got = run(mk, mk_pre), want = run(ref, ref_pre);
  EXPECT_GT(mk_pre, 0u) << "the ring pool should force preemptions";
  EXPECT_EQ(mk_pre, ref_pre);
  ASSERT_EQ(got.size(), 4u);
  for (const auto& [id, t] : want) {
    EXPECT_EQ(t.size(), 18u) << id;
    EXPECT_EQ(got.at(id), t) << "request " << id;
  }
}

// The cohere2_moe options North Mini Code as published does not use, as plan ops:
//  - shared experts (num_shared_experts): their MLP's units ride in the EXPERT_UP shares after the
//    routed ones and its down rows in the EXPERT_DOWN shares, F = routed + shared or their mean;
//  - LayerNorm (no rms_norm_eps): every norm of the tiles (input, final) is cpu-ref's layer_norm.
// At position 0 cpu-mk is bitwise cpu-ref (batch of 4); past the window and the ring it is
// routing-exact against cpu-ref; the option switched off moves the logits (the comparison sees it).
TEST(NorthCpuMk, SharedExpertsAndLayerNormMatchCpuRef) {
  struct Variant {
    const char* name;
    void (*apply)(ModelConfig&);
  };
  const Variant variants[] = {
      {"shared experts, summed",
       [](ModelConfig& c) {
         c.shared_intermediate_size = 2 * c.moe_intermediate_size;  // two shared experts
         c.shared_combine = SharedCombine::kSum;
       }},
      {"shared experts, averaged",
       [](ModelConfig& c) {
         c.shared_intermediate_size = c.moe_intermediate_size;
         c.shared_combine = SharedCombine::kAverage;
       }},
      {"LayerNorm", [](ModelConfig& c) { c.norm = NormKind::kLayer; }},
  };
  for (const Variant& variant : variants) {
    SCOPED_TRACE(variant.name);
    NorthCase k(0);
    ModelConfig c = k.c;
    variant.apply(c);
    const test::TestWeights w = test::random_weights(c, Dtype::kBF16, k.rng.next());
    // Position 0, a batch of 4: bitwise.
    const Scenario zero = make_scenario(c, k.rng, 4, 1, 1, 0);
    const std::vector<int32_t> tokens = test::random_tokens(k.rng, 4, c.vocab_size);
    auto step = [&](Backend& be) { return decode_at_position_zero(be, zero, tokens); };
    emu::CpuMkBackend mk(c, w.weights, w.store, options(zero, "cpu-mk", 1 + static_cast<int>(k.rng.below(7))));
    ref::RefBackend ref(c, w.weights, w.store, options(zero, "cpu-ref", 2));
    const std::vector<float> got = step(mk), want = step(ref);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
    // The option off (the same weights): the logits move, so the comparison above can see it.
    ModelConfig off = c;
    off.shared_intermediate_size = 0;
    off.norm = NormKind::kRms;
    ref::RefBackend plain(off, w.weights, w.store, options(zero, "cpu-ref", 2));
    EXPECT_GT(rel_err(step(plain), want), 1e-3);
    // Prompts of 1.5..2.5 rings and decode steps: routing-exact (kept short: this test runs under TSan).
    const int r = kv_ring_length(c.max_sliding_window(), kBlock);
    const Scenario sc = make_scenario(c, k.rng, 2, 3 * r * kBlock / 2, 5 * r * kBlock / 2, 3);
    const RunResult run = run_mk(sc, w, 1 + static_cast<int>(k.rng.below(8)), k.rng.next(), false, 8);
    expect_routing_exact(sc, w, run, 1e-5);
  }
}

TEST(NorthCpuMk, RefusesWhatItDoesNotImplementByName) {
  ModelConfig c = test::cohere_config();
  c.layers[1].sliding_window = 7;  // two windows
  try {
    check_model_plannable(c);
    FAIL() << "two sliding windows accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one sliding window"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megadecode
