// `megadecode make-model --preset NAME --seed S --out DIR`: a synthetic checkpoint in the exact
// Hugging Face layout (config.json, generation_config.json, model.safetensors or shards + index,
// tokenizer.json + tokenizer_config.json), so transformers loads the directory as is. The qwen3
// presets get the bundled Qwen3 tokenizer; the north-* presets a synthetic North tokenizer
// (tokenizer/north_synthetic.h) and the cmd4 chat template, so `serve` speaks chat and tools.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/args.h"
#include "core/check.h"
#include "core/json_file.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "model/weights.h"
#include "tokenizer/north_synthetic.h"

namespace megadecode {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kDefaultMaxShardBytes = int64_t{4} << 30;
constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json"};
constexpr uint64_t kNorthTokenizerSeed = 0;  // one vocabulary for every north-* checkpoint
const char* const kCmd4Template = MEGADECODE_SOURCE_DIR "/tests/data/cmd4/cmd4-hf.jinja";  // melody's

void usage() {
  std::printf(
      "usage: megadecode make-model --preset NAME --out DIR [--seed S] [--max-shard-bytes N]\n"
      "                             [--tokenizer-dir DIR | --no-tokenizer] [--config-only]\n"
      "  --config-only   write config.json and generation_config.json only (no weights)\n"
      "  the bundled tokenizer (Qwen3's) goes with the qwen3 presets; a north-* checkpoint gets a\n"
      "  synthetic North tokenizer (North's special tokens and pipeline) and the cmd4 chat template\n"
      "presets:");
  for (const std::string& p : preset_names()) std::printf(" %s", p.c_str());
  std::printf("\n");
}

// The generation_config.json of the model family: Qwen3-30B-A3B's sampling defaults and special
// tokens; for North Mini Code the model card's sampling (temperature 1.0, top-p 0.95) and the
// config's special tokens.
json generation_config(const ModelConfig& c) {
  if (c.model_type == "cohere2_moe") {
    return {{"bos_token_id", c.bos_token_id}, {"do_sample", true}, {"eos_token_id", c.eos_token_ids},
            {"temperature", 1.0},             {"top_p", 0.95}};
  }
  return {{"bos_token_id", 151643}, {"do_sample", true},  {"eos_token_id", {151645, 151643}},
          {"pad_token_id", 151643}, {"temperature", 0.6}, {"top_k", 20},
          {"top_p", 0.95}};
}

// Prints "bytes written / total" at most once a second, for checkpoints big enough to wait for.
class Progress {
 public:
  explicit Progress(size_t total) : enabled_(total >= (size_t{256} << 20)) {}
  void operator()(size_t done, size_t total) {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    if (done < total && now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    std::fprintf(stderr, "\rmake-model: %.2f / %.2f GB written (%3.0f%%)", done / 1e9, total / 1e9,
                 100.0 * static_cast<double>(done) / static_cast<double>(total));
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  std::chrono::steady_clock::time_point last_{};
};

// The cmd4 template's text; checked before the weights are written.
std::string cmd4_template_text() {
  MD_REQUIRE(fs::is_regular_file(kCmd4Template), "the cmd4 chat template ", kCmd4Template,
             " is missing (it ships with the source tree); pass --tokenizer-dir DIR or --no-tokenizer");
  std::ifstream in(kCmd4Template, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  MD_REQUIRE(in.good() || in.eof(), "cannot read ", kCmd4Template);
  return text.str();
}

// The synthetic North tokenizer fits `config` only if its special token ids are the config's.
void check_north_ids(const ModelConfig& config) {
  MD_REQUIRE(config.bos_token_id == kNorthBosToken && config.eos_token_ids == std::vector<int>{kNorthEosToken},
             "the synthetic North tokenizer has <BOS_TOKEN> ", kNorthBosToken, " and <|END_OF_TURN_TOKEN|> ",
             kNorthEosToken, "; this preset's config has other ids (pass --tokenizer-dir or --no-tokenizer)");
}

// A North tokenizer.json and tokenizer_config.json (with the cmd4 template) for `config`.
void write_north_tokenizer(const fs::path& out, const ModelConfig& config, const std::string& chat_template) {
  write_json((out / "tokenizer.json").string(),
             north_tokenizer_json(kNorthTokenizerSeed, config.vocab_size, north_pre_tokenizer()), /*indent=*/-1);
  write_json((out / "tokenizer_config.json").string(), north_tokenizer_config_json(chat_template));
}

}  // namespace

int cmd_make_model(int argc, char** argv) {
  Args args(argc, argv, {"preset", "seed", "out", "max-shard-bytes", "tokenizer-dir"}, {"no-tokenizer", "config-only", "help"});
  if (args.flag("help")) {
    usage();
    return 0;
  }
  MD_REQUIRE(args.positional().empty(), "unexpected argument \"", args.positional().front(),
             "\" (make-model takes flags only; see --help)");
  const ModelConfig config = preset_config(args.require("preset"));
  const int64_t seed = args.get_int("seed", 0);
  MD_REQUIRE(seed >= 0, "--seed must be non-negative, got ", seed);
  const fs::path out = args.require("out");
  const int64_t max_shard_bytes = args.get_int("max-shard-bytes", kDefaultMaxShardBytes);
  MD_REQUIRE(max_shard_bytes > 0, "--max-shard-bytes must be positive, got ", max_shard_bytes);

  // Check the tokenizer before spending minutes on weights.
  MD_REQUIRE(!args.has("tokenizer-dir") || !args.flag("no-tokenizer"), "--tokenizer-dir and --no-tokenizer conflict");
  fs::path tokenizer_dir;
  // The bundled tokenizer is Qwen3's: a cohere2_moe checkpoint gets the synthetic North one.
  const bool wants_tokenizer = !args.flag("no-tokenizer") && !args.flag("config-only");
  const bool north = config.model_type == "cohere2_moe";
  std::string north_template;
  if (wants_tokenizer && north && !args.has("tokenizer-dir")) {
    check_north_ids(config);
    north_template = cmd4_template_text();
  }
  if (wants_tokenizer && (!north || args.has("tokenizer-dir"))) {
    tokenizer_dir = args.get("tokenizer-dir", MEGADECODE_SOURCE_DIR "/data/tokenizer/qwen3");
    for (const char* f : kTokenizerFiles) {
      MD_REQUIRE(fs::is_regular_file(tokenizer_dir / f), "tokenizer file ", (tokenizer_dir / f).string(),
                 " is missing: run scripts/setup (it extracts the Qwen3 tokenizer into data/tokenizer/qwen3), "
                 "or pass --tokenizer-dir DIR, or --no-tokenizer for a checkpoint without one");
    }
  }

  fs::create_directories(out);
  write_json((out / "config.json").string(), model_config_to_json(config));
  write_json((out / "generation_config.json").string(), generation_config(config));
  if (args.flag("config-only")) {
    std::printf("make-model: wrote the %s config (no weights) to %s\n", args.get("preset", "").c_str(), out.string().c_str());
    return 0;
  }
  size_t total = 0, n_params = 0;
  for (const TensorSpec& s : expected_tensors(config)) {
    size_t n = 1;
    for (int64_t d : s.shape) n *= static_cast<size_t>(d);
    n_params += n;
    total += 2 * n;
  }
  Progress progress(total);
  write_synthetic_checkpoint(out, config, static_cast<uint64_t>(seed), static_cast<size_t>(max_shard_bytes),
                             [&](size_t done, size_t all) { progress(done, all); });
  if (!tokenizer_dir.empty()) {
    for (const char* f : kTokenizerFiles) {
      fs::copy_file(tokenizer_dir / f, out / f, fs::copy_options::overwrite_existing);
    }
  }
  if (!north_template.empty()) write_north_tokenizer(out, config, north_template);
  const bool has_tokenizer = !tokenizer_dir.empty() || !north_template.empty();
  std::printf("make-model: wrote %s (%zu parameters, %.3f GB of bf16 weights, seed %lld) to %s%s\n",
              args.get("preset", "").c_str(), n_params, total / 1e9, static_cast<long long>(seed),
              out.string().c_str(), !has_tokenizer ? " without a tokenizer (serve it with --skip-tokenizer-init)" : "");
  return 0;
}

}  // namespace megadecode
