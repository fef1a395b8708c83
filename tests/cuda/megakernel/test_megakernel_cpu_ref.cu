// cuda-mk against cpu-ref as it is (fp32 throughout, no device rounding points): the `small`
// preset (full widths, 128 experts, 2 layers) with the same synthetic weights on both sides,
// ragged batches over a shuffled paged KV cache whose history is random bf16 (copied into
// cpu-ref's fp32 store), one decode step. Routing-exact (routing_exact.h) with the fp32 near-tie
// bound; then max |logit err| <= 1e-2 * max |ref| on every row, greedy tokens equal where the
// reference's top-2 margin allows.
#include <cstdio>
#include <memory>

#include "model/loader.h"
#include "model/presets.h"
#include "ref/ref_backend.h"
#include "../gpu_test_util.h"
#include "../test_megakernel_util.h"

namespace megadecode::test {
namespace {

constexpr double kTol = 1e-2;
constexpr int kBlocks = 8000;

TEST(MegakernelCpuRef, MatchesCpuRefOnSmallPreset) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("small");
  const uint64_t seed = test_seed();
  std::printf("small preset, weight and case seed %llu (MEGADECODE_SEED reproduces)\n",
              static_cast<unsigned long long>(seed));
  const LoadedModel host = synthetic_model(c, seed);
  BackendOptions o;
  o.backend = "cuda-mk";
  o.n_kv_blocks = kBlocks;
  o.kv_block_size = 16;
  cuda::CudaBackend be(cuda::DeviceWeights::synthetic(c, seed), o);
  be.probe().set_poison_activations(true);
  SplitMix64 rng(seed ^ 0x5eedull);
  const std::vector<int> batches = gpu_quick() ? std::vector<int>{3, 64} : std::vector<int>{1, 3, 8, 17, 64};
  for (int batch : batches) {
    const int max_ctx = batch == 64 ? 1024 : 4096;
    const Case k = make_case(c, be, rng, batch, max_ctx, {batch == 64 ? 4096 : 1, 97, 16, 17});
    std::vector<int32_t> tokens;
    RoutingLog routing;
    const std::vector<float> dev = run_case(be, k, &tokens, &routing);
    RoutingAudit audit;
    const auto ref = cpu_ref_step(c, host.weights, k, kBlocks, routing, false, audit);
    expect_routing_exact(audit, static_cast<int64_t>(batch) * c.n_layers, kRouteNearTieMixed,
                         "batch " + std::to_string(batch));
    const Compare cmp = compare(dev, ref, tokens, c.vocab_size, kTol);
    std::printf("batch %2d: max |err| / max |ref| = %.3g (max |ref| %.3g), %d rows over the bound, %d token mismatches\n",
                batch, cmp.max_err, cmp.max_ref, cmp.n_bad, cmp.token_mismatch);
    EXPECT_EQ(cmp.n_nan, 0) << "batch " << batch << ": unwritten (NaN) logits";
    EXPECT_EQ(cmp.n_bad, 0) << "batch " << batch;
    EXPECT_EQ(cmp.token_mismatch, 0) << "batch " << batch;
  }
}

}  // namespace
}  // namespace megadecode::test
