// Tests of the composition root's inputs: the backend flags give BackendOptions' own defaults when
// absent and reject bad values naming the flag; the factory hands the options to the backend
// unchanged (what a backend reports back equals what was asked).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../ref/ref_test_util.h"
#include "cli/backend_factory.h"
#include "cli/backend_flags.h"
#include "core/check.h"
#include "model/presets.h"

namespace megadecode {
namespace {

BackendOptions parse(std::vector<std::string> words, const std::string& default_backend = "cpu-ref") {
  words.insert(words.begin(), "test");
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  const Args args(static_cast<int>(argv.size()), argv.data(),
                  {"backend", "block-size", "threads", "gpu-memory-utilization", "prefill-chunk"}, {});
  return backend_options_from(args, default_backend);
}

std::string error_of(const std::vector<std::string>& words) {
  try {
    parse(words);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BackendFlags, AbsentFlagsKeepTheOneSetOfDefaults) {
  const BackendOptions d;
  const BackendOptions o = parse({}, "cuda-mk");
  EXPECT_EQ(o.backend, "cuda-mk");
  EXPECT_EQ(o.kv_block_size, d.kv_block_size);
  EXPECT_EQ(o.n_kv_blocks, d.n_kv_blocks);
  EXPECT_EQ(o.n_threads, d.n_threads);
  EXPECT_EQ(o.gpu_memory_utilization, d.gpu_memory_utilization);
  EXPECT_EQ(o.prefill_chunk, d.prefill_chunk);
  EXPECT_EQ(o.policy, d.policy);
  EXPECT_EQ(o.n_sms, d.n_sms);
  EXPECT_EQ(o.wait_timeout_ms, d.wait_timeout_ms);
  EXPECT_EQ(o.kernel_flags, d.kernel_flags);
}

TEST(BackendFlags, GivenFlagsAreRead) {
  const BackendOptions o = parse({"--backend", "cuda-ops", "--block-size", "32", "--threads", "3",
                                  "--gpu-memory-utilization", "0.5", "--prefill-chunk", "512"});
  EXPECT_EQ(o.backend, "cuda-ops");
  EXPECT_EQ(o.kv_block_size, 32);
  EXPECT_EQ(o.n_threads, 3);
  EXPECT_EQ(o.gpu_memory_utilization, 0.5);
  EXPECT_EQ(o.prefill_chunk, 512);
  ASSERT_NE(BackendOptions{}.prefill_chunk, 0) << "the test needs a non-zero default";
  EXPECT_EQ(parse({"--prefill-chunk", "0"}).prefill_chunk, 0);  // prefill through the decode step
}

TEST(BackendFlags, BadValuesNameTheFlag) {
  EXPECT_NE(error_of({"--block-size", "0"}).find("--block-size"), std::string::npos);
  EXPECT_NE(error_of({"--block-size", "1025"}).find("--block-size"), std::string::npos);  // the CUDA backends' range
  EXPECT_NE(error_of({"--block-size", "4294967312"}).find("--block-size"), std::string::npos);  // 2^32 + 16: no wrap
  EXPECT_NE(error_of({"--threads", "-2"}).find("--threads"), std::string::npos);
  EXPECT_NE(error_of({"--gpu-memory-utilization", "1.5"}).find("--gpu-memory-utilization"), std::string::npos);
  EXPECT_NE(error_of({"--prefill-chunk", "-1"}).find("--prefill-chunk"), std::string::npos);
  EXPECT_NE(error_of({"--prefill-chunk", "65537"}).find("--prefill-chunk"), std::string::npos);
}

TEST(BackendFactory, HandsTheOptionsToTheBackendUnchanged) {
  const ModelConfig c = test::small_moe_config();
  test::TestWeights w = test::random_weights(c, Dtype::kBF16, 5);
  for (const char* name : {"cpu-ref", "cpu-mk"}) {
    const BackendOptions o{.backend = name, .kv_block_size = 7, .n_kv_blocks = 13, .n_threads = 2};
    const auto backend = make_backend(c, w.weights, w.store, o);
    EXPECT_EQ(backend->name(), name);
    EXPECT_EQ(backend->kv_block_size(), 7) << name;
    EXPECT_EQ(backend->n_kv_blocks(), 13) << name;
  }
  EXPECT_THROW(make_backend(c, w.weights, w.store, BackendOptions{.backend = "cpu-ref"}), Error);  // no KV blocks
  EXPECT_THROW(make_backend_with_random_weights(c, 0, BackendOptions{.backend = "cpu-mk", .n_kv_blocks = 8}), Error);
}

// A cohere2_moe model runs on cpu-ref and cpu-mk (the decode plan's parallel blocks, with its ring
// pool) and on every CUDA backend (the megakernel, the batched step and the prefill kernels). Shared
// experts and LayerNorm run on cpu-mk (plan ops); the CUDA backends refuse them by name, GPU or not.
TEST(BackendFactory, Cohere2MoeRunsOnEveryBackendButWhatThePlanLacks) {
  ModelConfig c = test::cohere_config();
  test::TestWeights w = test::random_weights(c, Dtype::kBF16, 5);
  EXPECT_EQ(make_backend(c, w.weights, w.store, BackendOptions{.backend = "cpu-ref", .n_kv_blocks = 4})->name(),
            "cpu-ref");
  const auto mk = make_backend(c, w.weights, w.store, BackendOptions{.backend = "cpu-mk", .n_kv_blocks = 4});
  EXPECT_EQ(mk->name(), "cpu-mk");
  EXPECT_EQ(mk->n_ring_blocks(), 4);  // as many as the full pool, cpu-ref's default
#if defined(MEGADECODE_HAVE_CUDA)
  // Every CUDA backend takes the model (north-tiny: the device paths' head dims), prefill kernels
  // and all: without a GPU the error is the GPU's, not the model's.
  const ModelConfig nt = preset_config("north-tiny");
  const test::TestWeights ntw = test::random_weights(nt, Dtype::kBF16, 7);
  for (const std::string name : {"cuda", "cuda-batched", "cuda-mk", "cuda-ops"}) {
    try {
      make_backend(nt, ntw.weights, ntw.store, BackendOptions{.backend = name, .n_kv_blocks = 4, .prefill_chunk = 256});
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("cohere2_moe"), std::string::npos) << name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("GPU"), std::string::npos) << name << ": " << e.what();
    }
  }
#endif
  c.shared_intermediate_size = 32;
  test::TestWeights shared = test::random_weights(c, Dtype::kBF16, 6);
  EXPECT_EQ(make_backend(c, shared.weights, shared.store, BackendOptions{.backend = "cpu-mk", .n_kv_blocks = 4})->name(),
            "cpu-mk");
#if defined(MEGADECODE_HAVE_CUDA)
  // Shared experts and LayerNorm: plan ops that no device kernel has yet.
  for (const bool layer_norm : {false, true}) {
    ModelConfig nts = nt;
    if (layer_norm)
      nts.norm = NormKind::kLayer;
    else
      nts.shared_intermediate_size = 2 * nts.moe_intermediate_size;
    const test::TestWeights ntsw = test::random_weights(nts, Dtype::kBF16, 8);
    for (const std::string name : {"cuda", "cuda-batched", "cuda-mk", "cuda-ops"}) {
      try {
        make_backend(nts, ntsw.weights, ntsw.store, BackendOptions{.backend = name, .n_kv_blocks = 4});
        ADD_FAILURE() << name << " accepted " << (layer_norm ? "LayerNorm" : "shared experts");
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(layer_norm ? "LayerNorm" : "shared experts"), std::string::npos)
            << name << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find("cpu-mk"), std::string::npos) << name << ": " << e.what();
      }
    }
  }
#endif
}

}  // namespace
}  // namespace megadecode
