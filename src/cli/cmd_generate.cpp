// `megadecode generate`: loads a model directory, prefills the prompt and streams generated tokens
// to stdout as they are sampled: text when the model directory has a tokenizer (token ids with
// --print-ids or without one); statistics go to stderr. Flags follow vLLM's sampling parameters.
#include <filesystem>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/backend_factory.h"
#include "cli/backend_flags.h"
#include "cli/commands.h"
#include "cli/generate_loop.h"
#include "core/args.h"
#include "core/check.h"
#include "core/stopwatch.h"
#include "model/loader.h"
#include "model/presets.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {
namespace {

constexpr const char* kUsage =
    "usage: megadecode generate (--model DIR | --random-weights --preset NAME [--weights-seed S])\n"
    "         (--prompt-ids 1,2,3 | --prompt TEXT [--chat]) [--max-tokens N (16)]\n"
    "         [--temperature T (1.0; 0 = greedy)] [--top-k K (0 = off)] [--top-p P (1.0)] [--min-p M (0)]\n"
    "         [--presence-penalty X] [--frequency-penalty X] [--repetition-penalty X (1.0)] [--seed S (0)]\n"
    "         [--backend cpu-ref|cpu-mk|cuda|cuda-mk|cuda-ops|cuda-batched] [--block-size B (16)] [--threads N (all)]\n"
    "         [--gpu-memory-utilization F (0.9)] [--prefill-chunk N]\n"
    "         [--ignore-eos] [--print-ids]\n"
    "  --prefill-chunk: GPU backends; tokens per prefill kernel pass (default 8192; 0: the decode step one\n"
    "  token at a time).\n"
    "  --random-weights: GPU backends only; the weights make-model --preset NAME --seed S would write,\n"
    "  generated on the GPU (no files).\n"
    "  --chat renders --prompt as one user message with the model's chat template.\n";

// tokenizer_dir: where tokenizer.json (and the chat template) were found.
std::vector<int32_t> prompt_ids(const Args& args, int vocab, const Tokenizer* tokenizer,
                                const std::filesystem::path& tokenizer_dir) {
  MD_REQUIRE(args.has("prompt-ids") != args.has("prompt"), "give exactly one of --prompt-ids and --prompt\n", kUsage);
  std::vector<int32_t> ids;
  if (args.has("prompt")) {
    MD_REQUIRE(tokenizer != nullptr, "--prompt needs tokenizer.json in the model directory; use --prompt-ids");
    std::string text = args.get("prompt", "");
    if (args.flag("chat")) {
      ChatInput chat;
      chat.messages.push_back(ChatMessage{"user", text, {}, {}, {}});
      text = ChatTemplate::load(tokenizer_dir).render(chat);
    }
    ids = tokenizer->encode(text, /*add_special_tokens=*/true);
    MD_REQUIRE(!ids.empty(), "--prompt: the text encodes to no tokens");
    return ids;
  }
  for (int64_t id : args.get_int_list("prompt-ids", {})) {
    MD_REQUIRE(id >= 0 && id < vocab, "--prompt-ids: token id ", id, " outside the vocabulary [0, ", vocab, ")");
    ids.push_back(static_cast<int32_t>(id));
  }
  MD_REQUIRE(!ids.empty(), "--prompt-ids: no token ids given");
  return ids;
}

SamplingParams sampling_from(const Args& args) {
  SamplingParams s;
  s.temperature = static_cast<float>(args.get_double("temperature", 1.0));
  s.top_k = static_cast<int>(args.get_int("top-k", 0));
  s.top_p = static_cast<float>(args.get_double("top-p", 1.0));
  s.min_p = static_cast<float>(args.get_double("min-p", 0.0));
  s.presence_penalty = static_cast<float>(args.get_double("presence-penalty", 0.0));
  s.frequency_penalty = static_cast<float>(args.get_double("frequency-penalty", 0.0));
  s.repetition_penalty = static_cast<float>(args.get_double("repetition-penalty", 1.0));
  s.seed = static_cast<uint64_t>(args.get_int("seed", 0));
  return s;
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  const Args args(argc, argv,
                  {"model", "prompt-ids", "prompt", "max-tokens", "temperature", "top-k", "top-p", "min-p", "seed",
                   "presence-penalty", "frequency-penalty", "repetition-penalty", "backend", "block-size", "threads",
                   "preset", "weights-seed", "gpu-memory-utilization", "prefill-chunk"},
                  {"ignore-eos", "help", "chat", "print-ids", "random-weights"});
  if (args.flag("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  MD_REQUIRE(args.positional().empty(), "unexpected argument \"", args.positional().front(), "\"\n", kUsage);
  const bool random_weights = args.flag("random-weights");
  MD_REQUIRE(random_weights != args.has("model"), "give exactly one of --model DIR and --random-weights --preset NAME\n",
             kUsage);
  BackendOptions options = backend_options_from(args, random_weights ? "cuda" : "cpu-ref");
  const Stopwatch t_load;
  std::shared_ptr<LoadedModel> model;
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  std::filesystem::path tokenizer_dir;
  if (random_weights) {
    MD_REQUIRE(options.backend.rfind("cuda", 0) == 0,
               "--random-weights generates the weights on the GPU: use --backend cuda, cuda-mk, cuda-ops or cuda-batched");
    config = preset_config(args.require("preset"));
    tokenizer_dir = std::filesystem::path(MEGADECODE_SOURCE_DIR) / "data/tokenizer/qwen3";
    if (std::filesystem::exists(tokenizer_dir / "tokenizer.json")) tokenizer = Tokenizer::load(tokenizer_dir);
  } else {
    const std::string model_dir = args.require("model");
    model = std::make_shared<LoadedModel>(load_model(model_dir));
    config = model->config;
    tokenizer_dir = model_dir;
    if (std::filesystem::exists(tokenizer_dir / "tokenizer.json")) tokenizer = Tokenizer::load(tokenizer_dir);
  }

  GenerateRequest request;
  request.prompt = prompt_ids(args, config.vocab_size, tokenizer.get(), tokenizer_dir);
  request.sampling = sampling_from(args);
  const int64_t max_tokens = args.get_int("max-tokens", 16);
  MD_REQUIRE(max_tokens >= 1 && max_tokens <= (1 << 24), "--max-tokens must be in [1, 2^24], got ", max_tokens);
  request.max_tokens = static_cast<int>(max_tokens);
  request.ignore_eos = args.flag("ignore-eos");
  request.eos_token_ids = config.eos_token_ids;
  MD_REQUIRE(request.prompt.size() + request.max_tokens <= static_cast<size_t>(config.max_position_embeddings),
             "prompt (", request.prompt.size(), ") + --max-tokens (", request.max_tokens,
             ") exceeds the model's max_position_embeddings ", config.max_position_embeddings);

  options.n_kv_blocks = blocks_needed(request, options.kv_block_size);
  std::unique_ptr<Backend> backend;
  if (random_weights) {
    backend = make_backend_with_random_weights(config, static_cast<uint64_t>(args.get_int("weights-seed", 0)), options);
  } else {
    backend = make_backend(config, model->weights, model, options);
  }
  const double load_ms = t_load.ms();

  const Stopwatch t_gen;
  double first_token_ms = 0;
  const bool print_text = tokenizer != nullptr && !args.flag("print-ids");
  std::unique_ptr<StreamingDetokenizer> detokenizer;
  if (print_text) detokenizer = std::make_unique<StreamingDetokenizer>(*tokenizer, /*skip_special_tokens=*/true);
  const GenerateResult result = generate(*backend, request, [&](int32_t token) {
    if (first_token_ms == 0) first_token_ms = t_gen.ms();
    if (print_text) {
      std::fputs(detokenizer->push(token).c_str(), stdout);
    } else {
      std::printf("%d ", token);
    }
    std::fflush(stdout);
  });
  const double total_ms = t_gen.ms();
  if (print_text) std::fputs(detokenizer->flush().c_str(), stdout);
  std::printf("\n");
  const size_t n = result.tokens.size();
  std::fprintf(stderr,
               "%s: load %.0f ms; prompt %zu tokens, first token after %.1f ms; %zu tokens generated, %.1f ms/token "
               "(%.1f tokens/s) after the first; finish_reason %s\n",
               backend->name().c_str(), load_ms, request.prompt.size(), first_token_ms, n,
               n > 1 ? (total_ms - first_token_ms) / static_cast<double>(n - 1) : 0.0,
               n > 1 ? 1000.0 * static_cast<double>(n - 1) / (total_ms - first_token_ms) : 0.0,
               result.finish_reason.c_str());
  return 0;
}

}  // namespace megadecode
