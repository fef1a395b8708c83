// The compute-sanitizer targets (scripts/gpu sanitize and quick run this binary under memcheck,
// racecheck, synccheck and initcheck, one test at a time with --gtest_filter), checked
// routing-exact against cpu-ref with the device's rounding points:
//  - Tiny: cuda-mk and cuda-ops on the `tiny` preset, one ragged decode step each, equal to each
//    other bitwise;
//  - Wide: cuda-mk on the `small` preset's widths (hidden 2048, 32/4 heads of 128, experts of 768)
//    at batch 8 with multi-split contexts (up to 7 splits of 256 keys and a one-split sequence),
//    cut to 1 layer, 16 experts and a vocabulary of 8,192 so that the tools (orders of magnitude
//    slower) finish in about a minute; the kernel's code paths are those of the full widths.
// Under the tools the counter waits get a long bound (MEGADECODE_WAIT_TIMEOUT_MS).
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "../gpu_test_util.h"
#include "model/loader.h"
#include "model/presets.h"
#include "../test_megakernel_util.h"

namespace megadecode::test {
namespace {

BackendOptions options(const std::string& backend, int n_blocks) {
  BackendOptions o;
  o.backend = backend;
  o.n_kv_blocks = n_blocks;
  o.kv_block_size = 16;
  if (const char* t = std::getenv("MEGADECODE_WAIT_TIMEOUT_MS")) o.wait_timeout_ms = std::atoll(t);
  return o;
}

// One decode step of `k` on `be`, routing-exact against cpu-ref; returns the logits.
std::vector<float> check_step(cuda::CudaBackend& be, const ModelConfig& c, const LoadedModel& host, const Case& k) {
  std::vector<int32_t> tokens;
  RoutingLog routing;
  std::vector<float> logits = run_case(be, k, &tokens, &routing);
  EXPECT_EQ(be.probe().check_counter_totals(), "") << be.name();
  RoutingAudit audit;
  const auto ref = cpu_ref_step(c, host.weights, k, be.n_kv_blocks(), routing, true, audit);
  expect_routing_exact(audit, static_cast<int64_t>(k.seqs.size()) * c.n_layers, kRouteNearTie, be.name());
  const Compare cmp = compare(logits, ref, tokens, c.vocab_size, 1e-2);
  std::printf("%s: max |err| / max |ref| = %.3g, %d rows over the bound, %d token mismatches\n", be.name().c_str(),
              cmp.max_err, cmp.n_bad, cmp.token_mismatch);
  EXPECT_EQ(cmp.n_nan, 0) << be.name() << ": unwritten (NaN) logits";
  EXPECT_EQ(cmp.n_bad, 0) << be.name();
  EXPECT_EQ(cmp.token_mismatch, 0) << be.name();
  return logits;
}

TEST(Sanitize, Tiny) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("tiny");
  const uint64_t seed = seed_for("tiny preset");
  const LoadedModel host = synthetic_model(c, seed);
  std::shared_ptr<const cuda::DeviceWeights> dev = cuda::DeviceWeights::synthetic(c, seed);
  std::vector<float> logits[2];
  SplitMix64 rng(seed);
  Case k;
  for (int per_op = 0; per_op < 2; ++per_op) {
    cuda::CudaBackend be(dev, options(per_op ? "cuda-ops" : "cuda-mk", 128));
    be.probe().set_poison_activations(true);
    if (per_op == 0) k = make_case(c, be, rng, 3, 700, {1, 37, 700});
    logits[per_op] = check_step(be, c, host, k);
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * 4), 0) << "cuda-mk != cuda-ops";
}

TEST(Sanitize, Wide) {
  MD_REQUIRE_GPU();
  ModelConfig c = preset_config("small");
  c.n_layers = 1;
  c.layers.resize(1);
  c.n_experts = 16;
  c.vocab_size = 8192;
  const uint64_t seed = seed_for("small widths, 1 layer, 16 experts, vocabulary 8192");
  const LoadedModel host = synthetic_model(c, seed);
  cuda::CudaBackend be(cuda::DeviceWeights::synthetic(c, seed), options("cuda-mk", 700));
  be.probe().set_poison_activations(true);
  SplitMix64 rng(seed);
  const Case k = make_case(c, be, rng, 8, 1800, {1800, 1, 513, 257, 256});
  check_step(be, c, host, k);
}

}  // namespace
}  // namespace megadecode::test
