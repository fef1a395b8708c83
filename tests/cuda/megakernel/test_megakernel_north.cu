// GPU tests of cohere2_moe (North Mini Code) on the decode megakernel (cuda-mk, and cuda-ops where
// it costs one more run), on the batched step (cuda-batched) and on the prefill kernels: north-tiny
// with random bf16 weights (the seed printed; MEGADECODE_SEED reproduces), its parallel blocks, the
// dense first layer, sigmoid routing, logit_scale, NoPE full layers and the sliding layers' 24-key
// window read and appended through the KV ring pool, with prompts that wrap the ring several times
// (through the decode paths one token at a time, --prefill-chunk 0, or in prefill pieces).
// Routing-exact against cpu-ref (routing_exact.h): the device's routing is captured, a choice that
// differs from the reference's own where the reference's k-th / (k+1)-th gap is not a near-tie
// fails, and the reference rerun on the device's routing (with the device's rounding points) must
// meet the tolerance on every row. Then bitwise repeatability, cuda-ops == cuda-mk, and batch
// invariance (each sequence alone gives its rows of the batch). Modelled on
// tests/emu/test_emulator_north.cpp (cpu-mk against cpu-ref) and test_megakernel.cu.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "../../ref/north_scenario.h"
#include "../../ref/ref_test_util.h"
#include "core/check.h"
#include "cuda/backend/cuda_backend.h"
#include "../gpu_test_util.h"
#include "kv/kv_cache.h"
#include "model/presets.h"
#include "model/routing.h"
#include "ref/ref_backend.h"
#include "../routing_exact.h"

namespace megadecode::test {
namespace {

constexpr int kBlock = 16;     // the megakernel's KV block (a power of two)
constexpr double kTol = 1e-2;  // max |dev - ref| / max |ref| per row, as the qwen3_moe megakernel tests

using Scenario = test::NorthScenario;
using RunResult = test::NorthRun;

Scenario make_scenario(const ModelConfig& c, SplitMix64& rng, int n_seqs, int min_prompt, int max_prompt, int n_steps) {
  return test::make_north_scenario(c, kBlock, rng, n_seqs, min_prompt, max_prompt, n_steps);
}

void run_scenario(const Scenario& sc, Backend& be, RunResult& out) { test::run_north_scenario(sc, be, out); }

// prefill_chunk 0: prompts through the decode path one token at a time; > 0: the prefill kernels in
// pieces of that many tokens (a sliding layer's piece in the scratch, its last positions back to the ring).
// Under compute-sanitizer (scripts/gpu sanitize) the megakernel's counter waits get a long bound.
BackendOptions options(const Scenario& sc, const std::string& backend, int prefill_chunk = 0) {
  BackendOptions o{.backend = backend, .kv_block_size = kBlock, .n_kv_blocks = sc.n_full};
  o.n_ring_blocks = sc.n_ring;
  o.prefill_chunk = prefill_chunk;
  if (const char* t = std::getenv("MEGADECODE_WAIT_TIMEOUT_MS")) o.wait_timeout_ms = std::atoll(t);
  return o;
}

// The scenario on `be`, NaN-poisoned activations, its routing captured.
RunResult run_captured(const Scenario& sc, cuda::CudaBackend& be) {
  be.probe().set_poison_activations(true);
  RunResult r;
  r.log = RoutingLog(sc.config.n_layers, sc.config.n_experts_per_tok);
  be.set_routing_capture(&r.log);
  run_scenario(sc, be, r);
  be.set_routing_capture(nullptr);
  return r;
}

// The scenario on a fresh CUDA backend (cuda-mk, cuda-ops or cuda-batched), its routing captured;
// NaN-poisoned activations, and (the megakernel) the planned counter totals checked after the last step.
RunResult run_dev(const Scenario& sc, const std::shared_ptr<cuda::DeviceWeights>& dev, const std::string& backend,
                  int prefill_chunk = 0) {
  BackendOptions o = options(sc, backend, prefill_chunk);
  o.max_batch = std::max<int>(o.max_batch, static_cast<int>(sc.prompts.size()));
  cuda::CudaBackend be(dev, o);
  EXPECT_EQ(be.n_ring_blocks(), sc.n_ring);
  const RunResult r = run_captured(sc, be);
  if (backend != "cuda-batched") EXPECT_EQ(be.probe().check_counter_totals(), "") << backend;
  return r;
}

// cpu-ref with the device's rounding points; with `forced`, the device's routing forced on it and
// audited into `audit`.
RunResult run_ref(const Scenario& sc, const TestWeights& w, const RoutingLog* forced, RoutingAudit* audit) {
  BackendOptions o = options(sc, "cpu-ref");
  o.n_threads = 0;  // every hardware thread: the full-width reference is the tests' slow part
  ref::RefBackend ref(sc.config, w.weights, w.store, o);
  ref.kv_store().fill(NAN);
  ref.set_device_rounding(true);
  RunResult r;
  r.log = RoutingLog(sc.config.n_layers, sc.config.n_experts_per_tok);
  ref.set_routing_record(&r.log);
  if (forced) ref.set_forced_routing(forced, audit);
  run_scenario(sc, ref, r);
  return r;
}

// The routing-exact comparison of one scenario: the device's routing against cpu-ref's own (near
// ties only: bound `near_tie`, kRouteNearTie for the megakernel, kRouteNearTieMixed for the batched
// step, whose q and P round to bf16 where cpu-ref's device rounding follows the megakernel), then
// cpu-ref forced with it, every row within kTol of the reference's max |logit|.
void expect_north_routing_exact(const Scenario& sc, const TestWeights& w, const RunResult& dev, const std::string& what,
                                double near_tie = kRouteNearTie) {
  int64_t tokens = 0;
  for (const auto& p : sc.prompts) tokens += static_cast<int64_t>(p.size());
  tokens += static_cast<int64_t>(sc.steps.size() * sc.prompts.size());
  ASSERT_EQ(static_cast<int64_t>(dev.log.size()), tokens) << what << ": the device's routing of every token";
  RoutingAudit audit;
  const RunResult forced = run_ref(sc, w, &dev.log, &audit);
  expect_routing_exact(audit, tokens * moe_layers(sc.config), near_tie, what);
  ASSERT_EQ(forced.rows.size(), dev.rows.size());
  double worst = 0;
  for (size_t i = 0; i < dev.rows.size(); ++i) {
    const double e = rel_err(dev.rows[i], forced.rows[i]);
    worst = std::isnan(e) ? e : std::max(worst, e);
    EXPECT_LE(e, kTol) << what << ": row " << i << " of " << dev.rows.size();  // NaN fails too
  }
  std::printf("%s: %zu rows, max |err| / max |ref| = %.3g\n", what.c_str(), dev.rows.size(), worst);
}

// A seeded case (the seed printed): a north preset, its sliding window set to `window` (0: its
// own), random bf16 weights on the host and the same weights uploaded to the device.
struct NorthCase {
  uint64_t seed = test_seed();
  SplitMix64 rng{(std::printf("seed %llu (MEGADECODE_SEED reproduces)\n", static_cast<unsigned long long>(seed)), seed)};
  ModelConfig c;
  TestWeights w;
  std::shared_ptr<cuda::DeviceWeights> dev;
  NorthCase(const std::string& preset, int window)
      : c(window ? with_window(preset_config(preset), window) : preset_config(preset)),
        w(random_weights(c, Dtype::kBF16, rng.next())),
        dev(cuda::DeviceWeights::upload(c, w.weights)) {}
};

// north-small (the real widths: hidden 2048, 128 experts top-8, head dim 128, 5 layers), its window
// cut to 40 keys so that short prompts wrap the ring (kv_ring_length(40, 16) = 4 blocks): one case
// for the binary (its 3G weights take ~50 s to draw), kept to the end.
NorthCase& north_small() {
  static NorthCase* k = new NorthCase("north-small", 40);
  return *k;
}

// Each pool's block holds only its own layers (engine/kv_pools.h): north-tiny's full pool keeps its
// 2 full layers, the ring pool its 3 sliding ones, and a ring pool left to the default holds
// max(R, min(full blocks, max_batch rings)) blocks. Then a scenario on such a backend is
// routing-exact against cpu-ref (its full pool's addresses through kv_full_index).
TEST(NorthPools, EachPoolHoldsItsOwnLayersAndTheRingIsSizedForMaxBatchRings) {
  MD_REQUIRE_GPU();
  NorthCase k("north-tiny", 0);
  const int r = kv_ring_length(k.c.max_sliding_window(), kBlock);  // 3
  const size_t layer_block = size_t{2} * k.c.n_kv_heads * kBlock * k.c.head_dim;
  for (const auto& [n_blocks, max_batch, want_ring] :
       std::vector<std::tuple<int, int, int>>{{40, 3, 3 * r}, {7, 3, 7}, {2, 1, r}}) {
    BackendOptions o{.backend = "cuda-mk", .kv_block_size = kBlock, .n_kv_blocks = n_blocks};
    o.max_batch = max_batch;
    cuda::CudaBackend be(k.dev, o);
    EXPECT_EQ(be.kv_cache_elements(), 2 * n_blocks * layer_block) << n_blocks;
    EXPECT_EQ(be.n_ring_blocks(), want_ring) << n_blocks;
    EXPECT_EQ(be.kv_ring_elements(), 3 * static_cast<size_t>(want_ring) * layer_block) << n_blocks;
  }
  Scenario sc = make_scenario(k.c, k.rng, 3, 5 * r * kBlock / 2, 3 * r * kBlock, 4);
  BackendOptions o = options(sc, "cuda-mk");
  o.n_ring_blocks = 0;  // the default: 3 rings for 3 sequences
  o.max_batch = 3;
  cuda::CudaBackend be(k.dev, o);
  ASSERT_EQ(be.n_ring_blocks(), 3 * r);
  sc.n_ring = be.n_ring_blocks();
  const RunResult dev = run_captured(sc, be);
  expect_north_routing_exact(sc, k.w, dev, "cuda-mk, default ring pool");
}

// north-tiny: 5 layers (dense + full RoPE, 3 sliding, full NoPE), window 24: a ring of
// kv_ring_length(24, 16) = 3 blocks (48 slots). Prompts of 2.5 to 4 rings and 6 decode steps.
TEST(NorthMegakernel, RoutingExactAgainstCpuRefAtBatchOneAndThreeWrappingTheRing) {
  MD_REQUIRE_GPU();
  NorthCase k("north-tiny", 0);
  ASSERT_EQ(k.c.block, BlockKind::kParallel);
  ASSERT_EQ(k.c.router, RouterKind::kSigmoidTopK);
  ASSERT_EQ(k.c.rope_style, RopeStyle::kInterleaved);
  ASSERT_NE(k.c.logit_scale, 1.0f);
  ASSERT_EQ(k.c.layers[0].ffn, FfnKind::kDense);
  const int r = kv_ring_length(k.c.max_sliding_window(), kBlock);
  for (int batch : {1, 3}) {
    const int longest = gpu_quick() ? 3 * r * kBlock : 4 * r * kBlock;
    const Scenario sc = make_scenario(k.c, k.rng, batch, 5 * r * kBlock / 2, longest, 6);
    for (const auto& p : sc.prompts) ASSERT_GE(static_cast<int>(p.size()), 2 * r * kBlock);
    const RunResult dev = run_dev(sc, k.dev, "cuda-mk");
    expect_north_routing_exact(sc, k.w, dev, "cuda-mk batch " + std::to_string(batch));
  }
}

// Bitwise: the same scenario twice gives the same rows and routing; cuda-ops (a launch per wave)
// the same bits as cuda-mk; each sequence alone its rows of the batch.
TEST(NorthMegakernel, BitwiseRepeatableCudaOpsEqualAndBatchInvariant) {
  MD_REQUIRE_GPU();
  NorthCase k("north-tiny", 0);
  const int r = kv_ring_length(k.c.max_sliding_window(), kBlock);
  const Scenario sc = make_scenario(k.c, k.rng, 3, r * kBlock, 3 * r * kBlock, 4);
  const size_t V = k.c.vocab_size;
  const RunResult a = run_dev(sc, k.dev, "cuda-mk");
  const RunResult b = run_dev(sc, k.dev, "cuda-mk");
  const RunResult ops = run_dev(sc, k.dev, "cuda-ops");
  ASSERT_EQ(a.rows.size(), b.rows.size());
  ASSERT_EQ(a.rows.size(), ops.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i) {
    EXPECT_EQ(std::memcmp(a.rows[i].data(), b.rows[i].data(), V * 4), 0) << "row " << i << " (repeat)";
    EXPECT_EQ(std::memcmp(a.rows[i].data(), ops.rows[i].data(), V * 4), 0) << "row " << i << " (cuda-ops)";
  }
  expect_same_routing(a.log, b.log);
  const int n = static_cast<int>(sc.prompts.size());
  for (int s = 0; s < n; ++s) expect_alone_rows_equal(run_dev(north_alone(sc, s), k.dev, "cuda-mk"), a, sc, s);
}

// north-small (north_small(): the real widths, a 40-key window); batch 2.
// The reference at full width is the slow part: skipped under MEGADECODE_GPU_QUICK.
TEST(NorthMegakernel, NorthSmallRoutingExactAgainstCpuRef) {
  MD_REQUIRE_GPU();
  if (gpu_quick()) GTEST_SKIP() << "full-width reference (MEGADECODE_GPU_QUICK)";
  NorthCase& k = north_small();
  const int r = kv_ring_length(k.c.max_sliding_window(), kBlock);
  const Scenario sc = make_scenario(k.c, k.rng, 2, r * kBlock + 10, 2 * r * kBlock, 3);
  const RunResult dev = run_dev(sc, k.dev, "cuda-mk");
  expect_north_routing_exact(sc, k.w, dev, "north-small cuda-mk batch 2");
}

// The batched step (cuda-batched) on north-tiny: its parallel blocks, the dense first layer as two
// dense GEMMs, sigmoid routing, logit_scale, NoPE full layers, and the sliding layers' last 24 keys
// read from (and written to) each row's ring of the ring pool, through a second split list.
// Routing-exact against cpu-ref at batch 1, 3 and 11 (11: 5 padding rows in its bucket), prompts of
// 2.5 to 4 rings; then bitwise repeat and batch invariance (each sequence alone, its rows bitwise).
TEST(NorthBatched, RoutingExactAgainstCpuRefAndBatchInvariant) {
  MD_REQUIRE_GPU();
  NorthCase k("north-tiny", 0);
  const int r = kv_ring_length(k.c.max_sliding_window(), kBlock);
  for (int batch : {1, 3, 11}) {
    const int longest = gpu_quick() ? 3 * r * kBlock : 4 * r * kBlock;
    const Scenario sc = make_scenario(k.c, k.rng, batch, 5 * r * kBlock / 2, longest, 6);
    const RunResult dev = run_dev(sc, k.dev, "cuda-batched");
    expect_north_routing_exact(sc, k.w, dev, "cuda-batched batch " + std::to_string(batch), kRouteNearTieMixed);
    if (batch != 3) continue;
    const RunResult again = run_dev(sc, k.dev, "cuda-batched");
    ASSERT_EQ(again.rows.size(), dev.rows.size());
    for (size_t i = 0; i < dev.rows.size(); ++i)
      EXPECT_EQ(std::memcmp(dev.rows[i].data(), again.rows[i].data(), k.c.vocab_size * 4), 0) << "row " << i;
    expect_same_routing(dev.log, again.log);
    for (int s = 0; s < batch; ++s)
      expect_alone_rows_equal(run_dev(north_alone(sc, s), k.dev, "cuda-batched"), dev, sc, s);
  }
}

// north-small at full width (hidden 2048, 128 experts top-8, head dim 128) on the batched step, its
// window cut to 40 keys; batch 5. Skipped under MEGADECODE_GPU_QUICK (the reference's cost).
TEST(NorthBatched, NorthSmallRoutingExactAgainstCpuRef) {
  MD_REQUIRE_GPU();
  if (gpu_quick()) GTEST_SKIP() << "full-width reference (MEGADECODE_GPU_QUICK)";
  NorthCase& k = north_small();
  const int r = kv_ring_length(k.c.max_sliding_window(), kBlock);
  const Scenario sc = make_scenario(k.c, k.rng, 5, r * kBlock + 10, 2 * r * kBlock, 3);
  const RunResult dev = run_dev(sc, k.dev, "cuda-batched");
  expect_north_routing_exact(sc, k.w, dev, "north-small cuda-batched batch 5", kRouteNearTieMixed);
}

// compute-sanitizer's case (scripts/gpu sanitize): north-tiny on the batched step, batch 3, prompts
// that wrap the ring once (one prefill piece each), two decode steps; routing-exact against cpu-ref.
TEST(Sanitize, NorthBatchedTiny) {
  MD_REQUIRE_GPU();
  NorthCase k("north-tiny", 0);
  const int r = kv_ring_length(k.c.max_sliding_window(), kBlock);
  const Scenario sc = make_scenario(k.c, k.rng, 3, r * kBlock + 2, r * kBlock + 12, 2);
  // The prompts in one prefill piece each (a step a token would be ~170 steps under the tools).
  const RunResult dev = run_dev(sc, k.dev, "cuda-batched", 64);
  expect_north_routing_exact(sc, k.w, dev, "sanitize cuda-batched batch 3", kRouteNearTieMixed);
}

// The prefill kernels on north-tiny (window 24, rings of 3 blocks of 16 = 48 slots): prompts of 2.5
// to 4 rings in pieces of 7 (inside one block), 40 (over the window, under the ring) and 100 (over
// the ring: only its last 3 blocks go back), each sliding layer's piece in the scratch with the
// window's mask; then 6 decode steps read the rings the pieces left (the megakernel on cuda-mk, the
// batched step on cuda-batched). Routing-exact against cpu-ref (kRouteNearTieMixed: the prefill
// kernels round q and P to bf16), batch 3.
TEST(NorthPrefill, PiecesRoutingExactAgainstCpuRefAcrossTheWindowAndTheRing) {
  MD_REQUIRE_GPU();
  NorthCase k("north-tiny", 0);
  const int r = kv_ring_length(k.c.max_sliding_window(), kBlock);
  const int longest = gpu_quick() ? 3 * r * kBlock : 4 * r * kBlock;
  const Scenario sc = make_scenario(k.c, k.rng, 3, 5 * r * kBlock / 2, longest, 6);
  for (const int chunk : {7, 40, 100}) {
    const RunResult dev = run_dev(sc, k.dev, "cuda-mk", chunk);
    expect_north_routing_exact(sc, k.w, dev, "prefill pieces of " + std::to_string(chunk) + ", cuda-mk decode",
                               kRouteNearTieMixed);
  }
  const RunResult batched = run_dev(sc, k.dev, "cuda-batched", 40);
  expect_north_routing_exact(sc, k.w, batched, "prefill pieces of 40, cuda-batched decode", kRouteNearTieMixed);
}

// north-small at full width, window cut to 40 (rings of 4 blocks = 64 slots), pieces of 64 and 150;
// batch 2. Skipped under MEGADECODE_GPU_QUICK (the reference's cost).
TEST(NorthPrefill, NorthSmallRoutingExactAgainstCpuRef) {
  MD_REQUIRE_GPU();
  if (gpu_quick()) GTEST_SKIP() << "full-width reference (MEGADECODE_GPU_QUICK)";
  NorthCase& k = north_small();
  const int r = kv_ring_length(k.c.max_sliding_window(), kBlock);
  const Scenario sc = make_scenario(k.c, k.rng, 2, 2 * r * kBlock + 10, 4 * r * kBlock, 3);
  for (const int chunk : {64, 150}) {
    const RunResult dev = run_dev(sc, k.dev, "cuda-mk", chunk);
    expect_north_routing_exact(sc, k.w, dev, "north-small prefill pieces of " + std::to_string(chunk),
                               kRouteNearTieMixed);
  }
}

// compute-sanitizer's case for the prefill kernels on North: batch 2, prompts of about 2 rings in
// pieces of 40, two decode steps; routing-exact against cpu-ref.
TEST(Sanitize, NorthPrefillTiny) {
  MD_REQUIRE_GPU();
  NorthCase k("north-tiny", 0);
  const int r = kv_ring_length(k.c.max_sliding_window(), kBlock);
  const Scenario sc = make_scenario(k.c, k.rng, 2, 2 * r * kBlock, 2 * r * kBlock + 20, 2);
  const RunResult dev = run_dev(sc, k.dev, "cuda-mk", 40);
  expect_north_routing_exact(sc, k.w, dev, "sanitize prefill pieces of 40", kRouteNearTieMixed);
}

}  // namespace
}  // namespace megadecode::test
