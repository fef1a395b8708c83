// cuda-mk and cuda-ops on the `tiny` preset: one ragged decode step each against cpu-ref
// (routing-exact, device rounding points), and equal to each other bitwise. Small enough that scripts/gpu also runs this binary
// under compute-sanitizer (memcheck, racecheck, synccheck); there the counter waits get a long
// bound (MEGADECODE_WAIT_TIMEOUT_MS), since the tools slow the kernel down by orders of magnitude.
#include <cstdlib>
#include <cstring>
#include <memory>

#include "gpu_test_util.h"
#include "model/loader.h"
#include "model/presets.h"
#include "test_megakernel_util.h"

namespace megadecode::test {
namespace {

TEST(MegakernelTiny, BothBackendsMatchTheReferenceAndEachOther) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("tiny");
  const uint64_t seed = test_seed();
  std::printf("tiny preset, seed %llu (MEGADECODE_SEED reproduces)\n", static_cast<unsigned long long>(seed));
  const LoadedModel host = synthetic_model(c, seed);
  std::shared_ptr<const cuda::DeviceWeights> dev = cuda::DeviceWeights::synthetic(c, seed);
  BackendOptions o;
  o.backend = "cuda-mk";
  o.n_kv_blocks = 128;
  o.kv_block_size = 16;
  if (const char* t = std::getenv("MEGADECODE_WAIT_TIMEOUT_MS")) o.wait_timeout_ms = std::atoll(t);
  std::vector<float> logits[2];
  SplitMix64 rng(seed);
  Case k;
  for (int per_op = 0; per_op < 2; ++per_op) {
    o.backend = (per_op == 1) ? "cuda-ops" : "cuda-mk";
    cuda::CudaBackend be(dev, o);
    be.set_poison_activations(true);
    if (per_op == 0) k = make_case(c, be, rng, 3, 700, {1, 37, 700});
    std::vector<int32_t> tokens;
    RoutingLog routing;
    logits[per_op] = run_case(be, k, &tokens, &routing);
    EXPECT_EQ(be.check_counter_totals(), "") << be.name();
    RoutingAudit audit;
    const auto ref = cpu_ref_step(c, host.weights, k, be.n_kv_blocks(), routing, true, audit);
    expect_routing_exact(audit, 3 * c.n_layers, kRouteNearTie, be.name());
    const Compare cmp = compare(logits[per_op], ref, tokens, c.vocab_size, 1e-2);
    std::printf("%s: max |err| / max |ref| = %.3g, %d bad rows, %d token mismatches\n", be.name().c_str(), cmp.max_err,
                cmp.n_bad, cmp.token_mismatch);
    EXPECT_EQ(cmp.n_nan, 0) << be.name() << ": unwritten (NaN) logits";
    EXPECT_EQ(cmp.n_bad, 0) << be.name();
    EXPECT_EQ(cmp.token_mismatch, 0) << be.name();
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * 4), 0) << "cuda-mk != cuda-ops";
}

}  // namespace
}  // namespace megadecode::test
