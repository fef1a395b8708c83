// cpu-ref against the external oracle: Hugging Face transformers' Qwen3MoeForCausalLM (fp32, eager
// attention) on the `tiny` preset written by `make-model --preset tiny --seed 0`. The golden file
// tests/data/hf_golden_tiny.{json,f32} was made on the GPU machine by scripts/hf_oracle (format in
// scripts/hf_reference.py). Tolerance: max |logit - ref| <= 1e-2 * max |ref| per stored position,
// and the greedy next token equal wherever the reference's top-2 margin exceeds that bound.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/loader.h"
#include "ref/ref_backend.h"

namespace megadecode {
namespace {

const std::string kGolden = std::string(MEGADECODE_SOURCE_DIR) + "/tests/data/hf_golden_tiny";

std::vector<float> read_floats(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<float> v(n);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  EXPECT_EQ(static_cast<size_t>(in.gcount()), n * sizeof(float)) << path << " is shorter than its metadata says";
  return v;
}

TEST(HfGolden, CpuRefMatchesTransformersOnTinyPreset) {
  std::ifstream meta_in(kGolden + ".json");
  ASSERT_TRUE(meta_in.good()) << "missing golden file " << kGolden << ".json (made by scripts/hf_oracle)";
  const nlohmann::json meta = nlohmann::json::parse(meta_in);
  ASSERT_EQ(meta.at("format"), "megadecode-hf-logits-v1");
  ASSERT_EQ(meta.at("dtype"), "float32");
  const int vocab = meta.at("vocab_size");
  const std::vector<float> golden = read_floats(kGolden + ".f32", meta.at("n_floats").get<size_t>());

  LoadedModel model = synthetic_model("tiny", 0);
  ASSERT_EQ(model.config.vocab_size, vocab);
  auto owner = std::make_shared<LoadedModel>(std::move(model));
  BackendOptions options;
  options.kv_block_size = 16;
  options.n_kv_blocks = 8;
  ref::RefBackend backend(owner->config, owner->weights, owner, options);

  int n_positions = 0;
  for (const auto& seq : meta.at("sequences")) {
    const std::vector<int32_t> tokens = seq.at("tokens").get<std::vector<int32_t>>();
    std::vector<int32_t> blocks(options.n_kv_blocks);
    for (int i = 0; i < options.n_kv_blocks; ++i) blocks[i] = options.n_kv_blocks - 1 - i;  // not contiguous
    std::vector<float> logits(tokens.size() * static_cast<size_t>(vocab));
    backend.prefill_all_logits(SeqChunk{0, tokens, 0, blocks}, logits);
    size_t offset = seq.at("offset");
    for (int pos : seq.at("positions").get<std::vector<int>>()) {
      const float* ref = golden.data() + offset;
      const float* ours = logits.data() + static_cast<size_t>(pos) * vocab;
      offset += vocab;
      float max_ref = 0, max_err = 0;
      for (int v = 0; v < vocab; ++v) {
        ASSERT_TRUE(std::isfinite(ours[v])) << "position " << pos << " logit " << v;
        max_ref = std::max(max_ref, std::fabs(ref[v]));
        max_err = std::max(max_err, std::fabs(ours[v] - ref[v]));
      }
      const float bound = 1e-2f * max_ref;
      EXPECT_LE(max_err, bound) << "sequence of " << tokens.size() << " tokens, position " << pos;
      // Greedy token: must agree unless the reference's top two are within the bound.
      std::vector<int> order(vocab);
      for (int v = 0; v < vocab; ++v) order[v] = v;
      std::partial_sort(order.begin(), order.begin() + 2, order.end(), [&](int a, int b) { return ref[a] > ref[b]; });
      const int ours_top = static_cast<int>(std::max_element(ours, ours + vocab) - ours);
      if (ref[order[0]] - ref[order[1]] > bound) {
        EXPECT_EQ(ours_top, order[0]) << "position " << pos;
      }
      std::printf("tokens %zu position %d: max |err| %.3g (bound %.3g, max |ref| %.3g)\n", tokens.size(), pos, max_err,
                  bound, max_ref);
      ++n_positions;
    }
  }
  EXPECT_GE(n_positions, 4);
}

}  // namespace
}  // namespace megadecode
