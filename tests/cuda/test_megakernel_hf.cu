// cuda-mk and cuda-ops against the external oracle, Hugging Face transformers' Qwen3MoeForCausalLM
// in fp32, routing-exact (routing_exact.h): the `small` preset written as a checkpoint with this
// run's seed (the GPU's synthetic weights for a seed are bit-identical to that checkpoint), random
// prompts of 1, 5, 37 and 300 tokens. Each sequence runs its prompt but the last token through
// prefill, then the last token as a decode step, with the device's routing captured;
// scripts/hf_reference.py --forced-routing then runs transformers on that routing and reports
// where its own top-k would have differed. Those differences must be near-ties of transformers'
// (bound kRouteNearTieMixed: fp32 against bf16 rounding points), and the step's logits within 1e-2 * max |ref| of transformers',
// the greedy token equal where the top-2 margin allows.
// Needs python3 with torch and transformers (the GPU machine): MEGADECODE_HF_PYTHON names the
// interpreter (default python3), MEGADECODE_HF_SCRIPT the script (default: the source tree's).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>

#include <nlohmann/json.hpp>

#include "cuda/backend/cuda_backend.h"
#include "gpu_test_util.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "routing_exact.h"

namespace megadecode::test {
namespace {

namespace fs = std::filesystem;

struct DeviceRun {
  std::vector<std::vector<float>> logits;  // [sequence][vocab] of the last token
  std::vector<int32_t> tokens;             // greedy token of each sequence
  RoutingLog routing;
};

DeviceRun run_device(std::shared_ptr<const cuda::DeviceWeights> w, const ModelConfig& c, const std::string& backend,
                     const std::vector<std::vector<int32_t>>& prompts) {
  BackendOptions o;
  o.backend = backend;
  o.n_kv_blocks = 256;
  o.kv_block_size = 16;
  cuda::CudaBackend be(std::move(w), o);
  be.set_poison_activations(true);
  DeviceRun out;
  out.routing = RoutingLog(c.n_layers, c.n_experts_per_tok);
  be.set_routing_capture(&out.routing);
  std::vector<int32_t> table(o.n_kv_blocks);
  std::iota(table.rbegin(), table.rend(), 0);  // blocks in descending order: not contiguous
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t>& t = prompts[i];
    const int n = static_cast<int>(t.size());
    const int64_t id = static_cast<int64_t>(i);
    if (n > 1) be.prefill(SeqChunk{id, std::span(t).first(n - 1), 0, table, {}}, {});
    DecodeSeq d;
    d.chunk = SeqChunk{id, std::span(t).subspan(n - 1, 1), n - 1, table, {}};
    d.sampling.temperature = 0.0f;
    DecodeResult r;
    be.decode(std::span<const DecodeSeq>(&d, 1), true, r);
    out.logits.push_back(r.logits);
    out.tokens.push_back(r.tokens[0]);
  }
  be.set_routing_capture(nullptr);
  return out;
}

// The routing file of scripts/hf_reference.py --forced-routing.
void write_routing(const fs::path& file, const ModelConfig& c, const std::vector<std::vector<int32_t>>& prompts,
                   const RoutingLog& routing) {
  nlohmann::json j;
  j["format"] = "megadecode-routing-v1";
  j["n_layers"] = c.n_layers;
  j["top_k"] = c.n_experts_per_tok;
  const int K = c.n_experts_per_tok;
  for (size_t i = 0; i < prompts.size(); ++i) {
    nlohmann::json experts = nlohmann::json::array();
    for (int pos = 0; pos < static_cast<int>(prompts[i].size()); ++pos) {
      const TokenRouting* t = routing.find(static_cast<int64_t>(i), pos);
      if (t == nullptr) throw std::runtime_error("no captured routing for sequence " + std::to_string(i) + " position " +
                                                 std::to_string(pos));
      nlohmann::json layers = nlohmann::json::array();
      for (int L = 0; L < c.n_layers; ++L)
        layers.push_back(std::vector<int32_t>(t->experts.begin() + L * K, t->experts.begin() + (L + 1) * K));
      experts.push_back(layers);
    }
    j["sequences"].push_back({{"tokens", prompts[i]}, {"experts", experts}});
  }
  std::ofstream(file) << j.dump() << "\n";
}

struct HfRun {
  std::vector<std::vector<float>> logits;  // [sequence][vocab] of the last position
  RoutingAudit audit;
};

HfRun run_transformers(const fs::path& model_dir, const fs::path& routing_file, const fs::path& prefix, int vocab) {
  const char* py = std::getenv("MEGADECODE_HF_PYTHON");
  const char* script = std::getenv("MEGADECODE_HF_SCRIPT");
  const std::string cmd = std::string(py ? py : "python3") + " " +
                          (script ? std::string(script) : std::string(MEGADECODE_SOURCE_DIR "/scripts/hf_reference.py")) +
                          " " + model_dir.string() + " --dtype float32 --forced-routing " + routing_file.string() +
                          " --out " + prefix.string() + " 2>&1 | tail -n 5";
  std::printf("%s\n", cmd.c_str());
  std::fflush(stdout);
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("transformers run failed: " + cmd);
  std::ifstream meta_in(prefix.string() + ".json");
  if (!meta_in) throw std::runtime_error("transformers wrote no " + prefix.string() + ".json (see its output above)");
  const nlohmann::json meta = nlohmann::json::parse(meta_in);
  if (meta.at("format") != "megadecode-hf-logits-v1" || meta.at("vocab_size") != vocab)
    throw std::runtime_error("unexpected transformers output metadata");
  std::vector<float> all(meta.at("n_floats").get<size_t>());
  std::ifstream f32(prefix.string() + ".f32", std::ios::binary);
  f32.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(all.size() * 4));
  if (static_cast<size_t>(f32.gcount()) != all.size() * 4) throw std::runtime_error("short transformers logits file");
  HfRun out;
  for (const auto& seq : meta.at("sequences")) {
    const size_t at = seq.at("offset").get<size_t>() + (seq.at("positions").size() - 1) * static_cast<size_t>(vocab);
    out.logits.emplace_back(all.begin() + static_cast<int64_t>(at), all.begin() + static_cast<int64_t>(at + vocab));
    const auto& a = seq.at("routing_audit");
    out.audit.n_forced += a.at("n_forced").get<int64_t>();
    for (const auto& d : a.at("diffs"))
      out.audit.diffs.push_back(RouteDiff{static_cast<int64_t>(out.logits.size() - 1), d.at(0).get<int>(),
                                          d.at(1).get<int>(), d.at(2).get<double>()});
  }
  return out;
}

TEST(MegakernelHf, MatchesTransformersOnSmallPreset) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("small");
  const uint64_t seed = seed_for("transformers vs cuda-mk/cuda-ops (weights and prompts)");
  SplitMix64 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {1, 5, 37, 300}) {
    prompts.emplace_back(n);
    for (int32_t& t : prompts.back()) t = static_cast<int32_t>(rng.below(c.vocab_size));
  }
  const fs::path dir = fs::temp_directory_path() / ("megadecode-hf-" + std::to_string(seed));
  fs::create_directories(dir);
  write_synthetic_checkpoint(dir / "model", c, seed, size_t(4) << 30);
  std::ofstream(dir / "model" / "config.json") << model_config_to_json(c).dump(2) << "\n";

  std::shared_ptr<const cuda::DeviceWeights> w = cuda::DeviceWeights::synthetic(c, seed);
  const std::vector<std::string> backends =
      gpu_quick() ? std::vector<std::string>{"cuda-mk"} : std::vector<std::string>{"cuda-mk", "cuda-ops"};
  for (const std::string& backend : backends) {
    const DeviceRun dev = run_device(w, c, backend, prompts);
    write_routing(dir / "routing.json", c, prompts, dev.routing);
    const HfRun hf = run_transformers(dir / "model", dir / "routing.json", dir / "hf", c.vocab_size);
    int64_t n_tokens = 0;
    for (const auto& p : prompts) n_tokens += static_cast<int64_t>(p.size());
    expect_routing_exact(hf.audit, n_tokens * c.n_layers, kRouteNearTieMixed, backend + " vs transformers");
    ASSERT_EQ(hf.logits.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<float>& ref = hf.logits[i];
      const std::vector<float>& got = dev.logits[i];
      double max_ref = 0, max_err = 0;
      int ref_top = 0, ref_second = -1;
      for (int v = 0; v < c.vocab_size; ++v) {
        ASSERT_TRUE(std::isfinite(got[v])) << backend << " logit " << v << " of a " << prompts[i].size() << "-token sequence";
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[v])));
        max_err = std::max(max_err, std::fabs(static_cast<double>(got[v]) - ref[v]));
        if (ref[v] > ref[ref_top]) ref_top = v;
      }
      for (int v = 0; v < c.vocab_size; ++v)
        if (v != ref_top && (ref_second < 0 || ref[v] > ref[ref_second])) ref_second = v;
      const double bound = 1e-2 * max_ref;
      std::printf("%s, %zu tokens: max |err| %.3g (bound %.3g, max |ref| %.3g), token %d (transformers %d)\n",
                  backend.c_str(), prompts[i].size(), max_err, bound, max_ref, dev.tokens[i], ref_top);
      EXPECT_LE(max_err, bound) << backend << ", " << prompts[i].size() << "-token sequence";
      if (ref[ref_top] - ref[ref_second] > 2 * bound)
        EXPECT_EQ(dev.tokens[i], ref_top) << backend << ", " << prompts[i].size() << " tokens";
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace megadecode::test
