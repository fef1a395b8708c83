// `megadecode serve MODEL_DIR [flags]` (or `serve --random-weights --preset NAME`): loads the
// model, tokenizer (none with --skip-tokenizer-init) and backend, starts the engine and the
// OpenAI-compatible HTTP server (TLS with --ssl-certfile/--ssl-keyfile, a Bearer key with
// --api-key), and runs until SIGINT/SIGTERM (a drain of --shutdown-timeout seconds, then exit 0)
// or a backend failure (exit 1): server/shutdown.h. Flags follow vLLM's names where the meaning
// is the same.
#include <pthread.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/backend_factory.h"
#include "cli/backend_flags.h"
#include "cli/commands.h"
#include "core/args.h"
#include "core/check.h"
#include "core/log.h"
#include "engine/engine.h"
#include "model/loader.h"
#include "model/presets.h"
#include "server/http_server.h"
#include "server/model_text.h"
#include "server/openai_service.h"
#include "server/shutdown.h"
#include "server/tls_context.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {
namespace {

constexpr const char* kUsage =
    "usage: megadecode serve (MODEL_DIR | --random-weights --preset NAME [--weights-seed S])\n"
    "         [--host H (127.0.0.1)] [--port P (8000)] [--backend cpu-ref|cpu-mk|cuda|cuda-mk|cuda-ops|cuda-batched]\n"
    "         [--served-model-name NAME] [--max-num-seqs N (256)] [--max-model-len N]\n"
    "         [--max-num-batched-tokens N (2048)] [--block-size B (16)] [--kv-cache-tokens N]\n"
    "         [--gpu-memory-utilization F (0.9)] [--no-enable-prefix-caching] [--max-waiting N (1024)]\n"
    "         [--io-threads N (2)] [--max-body-bytes N (8 MiB)] [--threads N (all)] [--prefill-chunk N]\n"
    "         [--chat-template FILE] [--tool-call-parser hermes|qwen3_coder|cohere_command4|none]\n"
    "         [--reasoning-parser qwen3|cohere_command4|none] [--skip-tokenizer-init] [--shutdown-timeout S (30)]\n"
    "         [--api-key KEY] [--protect-metrics] [--ssl-certfile CERT.pem --ssl-keyfile KEY.pem]\n"
    "         [--log-steps] [--disable-overlap-schedule] [--no-mixed-steps] [--mixed-itl-ratio F (1.6)]\n"
    "  --backend: default cpu-ref for a model directory, cuda with --random-weights. cuda picks each decode\n"
    "  step's path: the megakernel for small batches, the batched step above the measured crossover;\n"
    "  cuda-mk (batches <= 64) and cuda-batched force one path.\n"
    "  --kv-cache-tokens: KV capacity; default 32768 on CPU backends, from --gpu-memory-utilization on GPUs.\n"
    "  --random-weights: the weights make-model --preset NAME --seed S would write, generated on the GPU\n"
    "  (in host memory on CPU backends), with the Qwen3 tokenizer of data/tokenizer/qwen3.\n"
    "  --skip-tokenizer-init: load no tokenizer (vLLM's flag). Completions take token-id prompts only and\n"
    "  return the generated ids as \"token_ids\" (\"text\" is empty); chat, text prompts, echo, stop strings,\n"
    "  logprobs, /tokenize and /detokenize are refused. End tokens come from config.json and\n"
    "  generation_config.json (--random-weights: the preset's config).\n"
    "  --prefill-chunk: GPU backends; tokens per prefill kernel pass (default 8192; 0: the decode step one\n"
    "  token at a time). The scheduler's chunk is --max-num-batched-tokens.\n"
    "  --tool-call-parser, --reasoning-parser: default from the chat template (Qwen3: hermes and qwen3;\n"
    "  Qwen3-Coder: qwen3_coder and none; cmd4: cohere_command4 and cohere_command4).\n"
    "  --chat-template: a Qwen3, Qwen3-Coder or cmd4 template file.\n"
    "  --shutdown-timeout: on SIGTERM/SIGINT, seconds in-flight requests may still run (new ones get 503);\n"
    "  then the rest end with an error. A second signal exits at once.\n"
    "  --api-key (or MEGADECODE_API_KEY): every route but /health and /metrics needs\n"
    "  \"Authorization: Bearer KEY\"; --protect-metrics: /metrics too.\n"
    "  --ssl-certfile, --ssl-keyfile: serve HTTPS only (PEM files).\n"
    "  --log-steps: one log line per decode step: the host's time by phase and the wait for the device.\n"
    "  --disable-overlap-schedule: process each step's tokens before launching the next (SGLang's flag;\n"
    "  by default, on a backend that decodes asynchronously, step N+1 runs while the host processes N).\n"
    "  --no-mixed-steps: run prompts as separate prefill calls only. By default, on a backend that mixes\n"
    "  (cuda, cuda-batched), while any stream decodes the prompts ride in its decode step (chunked prefill\n"
    "  in the step), as many prompt tokens a step as keep that step within --mixed-itl-ratio x the time of\n"
    "  a step without them (measured as the server runs); with no stream decoding a prompt is prefilled\n"
    "  in pieces of --max-num-batched-tokens.\n";

int int_flag(const Args& args, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const int64_t v = args.get_int(name, fallback);
  MD_REQUIRE(v >= lo && v <= hi, "--", name, " must be in [", lo, ", ", hi, "], got ", v);
  return static_cast<int>(v);
}

// The chat flags as given; each needs a tokenizer, so none goes with --skip-tokenizer-init.
ChatFlags chat_flags_from(const Args& args, bool skip_tokenizer) {
  for (const char* name : {"chat-template", "tool-call-parser", "reasoning-parser"})
    MD_REQUIRE(!skip_tokenizer || !args.has(name), "--", name, " needs a tokenizer: it cannot be used with ",
               "--skip-tokenizer-init");
  ChatFlags flags;
  if (args.has("chat-template")) flags.chat_template = args.get("chat-template", "");
  if (args.has("tool-call-parser")) flags.tool_call_parser = args.get("tool-call-parser", "");
  if (args.has("reasoning-parser")) flags.reasoning_parser = args.get("reasoning-parser", "");
  return flags;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  const Args args(argc, argv,
                  {"host", "port", "backend", "served-model-name", "max-num-seqs", "max-model-len",
                   "max-num-batched-tokens", "block-size", "kv-cache-tokens", "max-waiting", "io-threads",
                   "max-body-bytes", "threads", "gpu-memory-utilization", "preset", "weights-seed", "prefill-chunk",
                   "chat-template", "tool-call-parser", "reasoning-parser", "shutdown-timeout", "api-key",
                   "ssl-certfile", "ssl-keyfile", "mixed-itl-ratio"},
                  {"no-enable-prefix-caching", "random-weights", "skip-tokenizer-init", "help", "protect-metrics",
                   "log-steps", "disable-overlap-schedule", "no-mixed-steps"});
  if (args.flag("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const bool random_weights = args.flag("random-weights");
  const bool skip_tokenizer = args.flag("skip-tokenizer-init");
  const ChatFlags chat_flags = chat_flags_from(args, skip_tokenizer);
  MD_REQUIRE(args.positional().size() == (random_weights ? 0u : 1u),
             random_weights ? "--random-weights takes no MODEL_DIR\n" : "expected one MODEL_DIR\n", kUsage);
  BackendOptions options = backend_options_from(args, random_weights ? "cuda" : "cpu-ref");
  const bool gpu = options.backend.rfind("cuda", 0) == 0;
  int max_num_seqs = int_flag(args, "max-num-seqs", 256, 1, BackendOptions::kMaxBatch);
  options.max_batch = max_num_seqs;
  const int block_size = options.kv_block_size;
  const int64_t kv_tokens = args.get_int("kv-cache-tokens", gpu ? 0 : 32768);
  MD_REQUIRE(kv_tokens == 0 || kv_tokens >= block_size, "--kv-cache-tokens must hold at least one block");
  MD_REQUIRE(kv_tokens > 0 || gpu, "--kv-cache-tokens must be positive on CPU backends");
  const double shutdown_s = args.get_double("shutdown-timeout", 30.0);
  MD_REQUIRE(shutdown_s >= 0 && shutdown_s <= 86400, "--shutdown-timeout must be in [0, 86400] seconds, got ", shutdown_s);
  const char* env_key = std::getenv("MEGADECODE_API_KEY");
  const ApiKeyGuard api_key(args.get("api-key", env_key != nullptr ? env_key : ""), args.flag("protect-metrics"));
  MD_REQUIRE(api_key.enabled() || !args.flag("protect-metrics"), "--protect-metrics needs --api-key (or MEGADECODE_API_KEY)");
  if (args.has("ssl-certfile") || args.has("ssl-keyfile"))  // unusable files: the first error, before the model loads
    make_tls_server_context(args.get("ssl-certfile", ""), args.get("ssl-keyfile", ""));

  // Block SIGINT/SIGTERM before any thread starts, so that only serve_until_shutdown() receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  options.n_kv_blocks = static_cast<int>((kv_tokens + block_size - 1) / block_size);

  std::filesystem::path model_dir;
  std::shared_ptr<LoadedModel> model;
  ModelConfig config;
  std::unique_ptr<Backend> backend;
  if (random_weights) {
    config = preset_config(args.require("preset"));
    MD_REQUIRE(skip_tokenizer || config.model_type != "cohere2_moe", "--random-weights --preset ",
               args.get("preset", ""), ": the bundled tokenizer is Qwen3's, not this model's; add --skip-tokenizer-init");
    if (!skip_tokenizer)  // tokenizer files only; without a tokenizer, no directory at all
      model_dir = std::filesystem::path(MEGADECODE_SOURCE_DIR) / "data/tokenizer/qwen3";
    const auto weights_seed = static_cast<uint64_t>(args.get_int("weights-seed", 0));
    if (gpu) {
      backend = make_backend_with_random_weights(config, weights_seed, options);
    } else {  // CPU backends: the same weights built in host memory (small presets; scripted runs)
      model = std::make_shared<LoadedModel>(synthetic_model(config, weights_seed));
      backend = make_backend(config, model->weights, model, options);
    }
  } else {
    model_dir = args.positional()[0];
    log_info("loading ", model_dir.string());
    model = std::make_shared<LoadedModel>(load_model(model_dir));
    config = model->config;
    backend = make_backend(config, model->weights, model, options);
  }
  // The default takes what the backend decodes at most (cuda-mk: 64); a larger value given is an error.
  if (!args.has("max-num-seqs")) max_num_seqs = std::min(max_num_seqs, backend->max_decode_batch());
  MD_REQUIRE(max_num_seqs <= backend->max_decode_batch(), "--max-num-seqs ", max_num_seqs, ": backend ", backend->name(),
             " decodes at most ", backend->max_decode_batch(), " sequences a step (use --backend cuda, or a smaller "
             "--max-num-seqs)");
  std::unique_ptr<Tokenizer> tokenizer;
  if (!skip_tokenizer) tokenizer = Tokenizer::load(model_dir);

  EngineConfig ec;
  ec.scheduler.max_num_seqs = max_num_seqs;
  ec.scheduler.max_prefill_tokens = int_flag(args, "max-num-batched-tokens", 2048, 1, 1 << 20);
  ec.scheduler.prefix_caching = !args.flag("no-enable-prefix-caching");
  ec.scheduler.overlap = args.flag("disable-overlap-schedule") ? Overlap::kOff : Overlap::kAuto;
  ec.scheduler.log_steps = args.flag("log-steps");
  ec.scheduler.mixed_steps = !args.flag("no-mixed-steps");
  ec.scheduler.mixed_itl_ratio = args.get_double("mixed-itl-ratio", 1.6);
  MD_REQUIRE(ec.scheduler.mixed_itl_ratio > 1.0 && ec.scheduler.mixed_itl_ratio <= 100.0,
             "--mixed-itl-ratio must be in (1, 100], got ", ec.scheduler.mixed_itl_ratio);
  ec.max_model_len = int_flag(args, "max-model-len", 0, 0, 1 << 30);
  ec.max_waiting = int_flag(args, "max-waiting", 1024, 1, 1 << 20);
  Engine engine(*backend, ec, tokenizer ? streaming_decoders(*tokenizer) : no_text_decoders());

  const std::string name =
      args.get("served-model-name", random_weights ? args.require("preset") : args.positional()[0]);
  ServedModel served = tokenizer ? served_model(model_dir, name, config, *tokenizer, chat_flags)
                                 : served_model_without_tokenizer(model_dir, name, config);
  OpenAiService service(engine, served, api_key);
  HttpServerConfig hc;
  hc.host = args.get("host", "127.0.0.1");
  hc.port = int_flag(args, "port", 8000, 0, 65535);
  hc.n_threads = int_flag(args, "io-threads", 2, 1, 256);
  hc.max_body_bytes = static_cast<size_t>(args.get_int("max-body-bytes", 8 << 20));
  hc.ssl_certfile = args.get("ssl-certfile", "");
  hc.ssl_keyfile = args.get("ssl-keyfile", "");
  raise_open_file_limit();
  HttpServer http(hc, service.handler());
  engine.start();
  http.start();
  log_info("serving ", name, tokenizer ? "" : " as token ids (--skip-tokenizer-init)", " (backend ", backend->name(),
           ", max_model_len ", engine.max_model_len(), ", ", backend->n_kv_blocks(), " KV blocks of ", block_size,
           backend->n_ring_blocks() > 0 ? cat(" and ", backend->n_ring_blocks(), " ring blocks (sliding layers)") : "",
           ", max_num_seqs ", max_num_seqs, ") on ", http.tls() ? "https" : "http", "://", hc.host, ":", http.port(),
           api_key.enabled() ? " (API key required)" : "");

  ShutdownOptions shutdown;
  shutdown.drain_timeout = std::chrono::milliseconds(static_cast<int64_t>(shutdown_s * 1000));
  const ServeOutcome outcome = serve_until_shutdown(http, engine, signals, shutdown);
  if (outcome.end == ServeEnd::kSecondSignal) std::_Exit(outcome.exit_code());  // at once: no joins
  return outcome.exit_code();
}

}  // namespace megadecode
