// Structured output on every CUDA path (ctest label gpu from the `_gpu` suffix): 200 random
// schemas of the supported subset (structured_test_util.h's generator) through the Scheduler's
// overlapped loop on cuda-mk, cuda-ops, cuda-batched and cuda, the tiny model's synthetic weights
// over a synthetic vocabulary of Qwen3's size (bytes, JSON-flavoured merges, specials; the last is
// the end token), 32 sequences a step, temperature 1: every output that ends with the end token
// parses and validates against its schema, a constrained row never chains, no KV block leaks.
// The device paths apply the masks (the megakernel's SAMPLE, the batched step's sampler); the
// CPU test of the same loop is test_server_tiny_model's ThousandSchemasHoldOnCpuRef.
#include <gtest/gtest.h>

#if defined(MEGADECODE_HAVE_CUDA)
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../cuda/gpu_test_util.h"
#include "../structured/structured_test_util.h"
#include "core/rng.h"
#include "cuda/backend/cuda_backend.h"
#include "model/presets.h"
#include "overlap_harness.h"

namespace megadecode {
namespace {

using structured::testing::Json;

TEST(StructuredGpu, TwoHundredSchemasHoldOnEveryPath) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("tiny");
  SplitMix64 rng = testing::seeded_rng();
  const uint64_t seed = rng.next();
  std::shared_ptr<cuda::DeviceWeights> w = cuda::DeviceWeights::synthetic(c, rng.next());
  structured::Compiler compiler(structured::testing::synthetic_vocab(seed, c.vocab_size));
  const structured::Vocabulary& vocab = compiler.vocab();
  const int32_t end = vocab.end_ids()[0];
  structured::testing::SchemaGenerator gen(seed);
  constexpr int kSchemas = 200;
  std::vector<Json> schemas;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kSchemas; ++i) {
    schemas.push_back(gen.schema());
    std::vector<int32_t> p;
    for (int k = 0, n = 2 + static_cast<int>(rng.below(12)); k < n; ++k)
      p.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(end) - 2)));
    prompts.push_back(std::move(p));
  }
  for (const char* backend : {"cuda-mk", "cuda-ops", "cuda-batched", "cuda"}) {
    std::vector<SequenceRequest> reqs;
    for (int i = 0; i < kSchemas; ++i) {
      SequenceRequest s;
      s.request_id = static_cast<uint64_t>(i) + 1;
      s.prompt = prompts[static_cast<size_t>(i)];
      s.sampling.temperature = 1.0f;
      s.sampling.seed = seed + static_cast<uint64_t>(i);
      s.stop.max_tokens = 48;
      s.stop.eos_token_ids = {end};
      s.constraint = compiler.make(structured::Spec::json_schema(schemas[static_cast<size_t>(i)].dump()));
      reqs.push_back(std::move(s));
    }
    BackendOptions o;
    o.backend = backend;
    o.kv_block_size = 16;
    o.n_kv_blocks = 1024;
    o.prefill_chunk = 64;
    cuda::CudaBackend be(w, o);
    testing::RunSetup setup;
    setup.scheduler.max_num_seqs = 32;
    setup.scheduler.max_prefill_tokens = 256;
    setup.scheduler.overlap = Overlap::kAuto;
    const testing::Outcome out = testing::run(be, setup, reqs);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(out.n_chained, 0u) << backend << ": a constrained row chained";
    int n_stop = 0, n_length = 0, n_overflow = 0, n_failed = 0;
    for (int i = 0; i < kSchemas && n_failed < 5; ++i) {
      const auto it = out.events.find({static_cast<uint64_t>(i) + 1, 0});
      ASSERT_NE(it, out.events.end()) << backend << ": request " << i + 1 << " has no events";
      std::string text;
      FinishReason finish = FinishReason::kError;
      for (const SeqOutput& e : it->second) {
        for (const int32_t t : e.tokens)
          if (t != end) text += vocab.bytes(t);
        if (e.finished) finish = e.finish_reason;
      }
      ASSERT_NE(finish, FinishReason::kError) << backend << ": request " << i + 1 << ": " << text;
      if (finish == FinishReason::kLength) {
        ++n_length;
        continue;
      }
      ++n_stop;
      Json v;
      try {
        v = Json::parse(text);
      } catch (const nlohmann::json::out_of_range&) {
        ++n_overflow;  // a number beyond a double: valid JSON the parser refuses
        continue;
      } catch (const nlohmann::json::exception& e) {
        ADD_FAILURE() << backend << ", schema " << i << ": " << text << " does not parse: " << e.what() << "\n"
                      << schemas[static_cast<size_t>(i)].dump();
        ++n_failed;
        continue;
      }
      const std::string why = structured::testing::validate(v, schemas[static_cast<size_t>(i)], schemas[static_cast<size_t>(i)]);
      if (!why.empty()) {
        ADD_FAILURE() << backend << ", schema " << i << ": " << text << " fails: " << why << "\n"
                      << schemas[static_cast<size_t>(i)].dump();
        ++n_failed;
      }
    }
    std::printf("%s: %d ended by the end token, %d cut by max_tokens (%d with numbers beyond a double)\n", backend,
                n_stop, n_length, n_overflow);
    EXPECT_GE(n_stop, kSchemas * 4 / 10) << backend;
  }
}

}  // namespace
}  // namespace megadecode
#endif
