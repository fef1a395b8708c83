// The OpenAI-compatible API on top of the engine: routes, request validation against the model
// (tokenization, context length, token ranges), defaults from generation_config.json, and the
// small endpoints (/v1/models, /health, /metrics, /tokenize, /detokenize).
//   POST /v1/completions, POST /v1/chat/completions   generation (SSE with "stream": true)
//   GET  /v1/models, GET /health, GET /metrics, GET /version (HEAD too: headers only)
//   POST /tokenize, POST /detokenize
// Every POST needs a JSON Content-Type (else 415); with an API key (api_key.h) every route but
// /health (and /metrics unless protected) needs it (else 401). /health is 503 while the engine
// drains or after it failed.
// Without a tokenizer (--skip-tokenizer-init) it serves token ids only: completions of token-id
// prompts whose choices carry the generated "token_ids" (text ""); what needs text (text prompts,
// chat, echo, stop strings, logprobs, /tokenize, /detokenize) is a 400 that says why.
// Threading: handle() runs on any I/O thread, concurrently; the service itself is immutable after
// construction (the tokenizer is thread-safe, the engine's submit/abort are).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/api_key.h"
#include "server/chat_request.h"
#include "server/exchange.h"
#include "server/generation_defaults.h"
#include "server/openai_request.h"
#include "structured/compiler.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {

struct ServedModel {
  std::string name;                    // what clients send as "model"
  std::string root;                    // the model directory, else the name (shown by /v1/models)
  const Tokenizer* tokenizer = nullptr;  // outlives the service; null: token ids only (--skip-tokenizer-init)
  ChatSupport chat;                    // the chat template and output formats
  GenerationDefaults defaults;
  std::vector<int32_t> eos_token_ids;  // every end token (config.json, generation_config.json, tokenizer)
};

class OpenAiService {
 public:
  OpenAiService(Engine& engine, ServedModel model, ApiKeyGuard api_key = {});
  void handle(HttpRequest&& request, std::shared_ptr<Exchange> exchange);
  HttpHandler handler() {
    return [this](HttpRequest&& r, std::shared_ptr<Exchange> e) { handle(std::move(r), std::move(e)); };
  }

 private:
  void generate(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange, Endpoint endpoint);
  void tokenize(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);
  void detokenize(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);
  void models(const std::shared_ptr<Exchange>& exchange);
  void metrics(const std::shared_ptr<Exchange>& exchange);
  void check_model(const std::optional<std::string>& model) const;
  void require_tokenizer(const char* what, const char* param) const;
  void refuse_text_fields(const OpenAiRequest& r) const;
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const;
  int prompt_vocab_size() const;
  uint64_t fresh_seed();
  // Structured output: each sequence's constraint (a grammar compiled once a request, cached by spec),
  // after the model's reasoning when the output starts in it. ApiError 400 for a spec it cannot enforce.
  std::vector<std::shared_ptr<TokenConstraint>> constraints(const StructuredOutput& so, const ChatOutputOptions& chat_output,
                                                            bool chat, int n);
  // A forced Hermes call held to its tools' schemas (forced_tool_call.h): each sequence's constraint.
  // ApiError 400 naming the tool whose parameters it cannot enforce.
  std::vector<std::shared_ptr<TokenConstraint>> call_constraints(const ChatRequest& chat, int n);
  // The id of the tool format's closing tag ("</tool_call>", "<|END_ACTION|>") when it is one token of
  // the tokenizer (a held call's close), else -1; found once, at construction.
  static int32_t find_held_close_id(const ServedModel& model);
  structured::Compiler& compiler();

  Engine& engine_;
  ServedModel model_;
  ApiKeyGuard api_key_;
  int64_t started_at_;
  std::atomic<uint64_t> seed_counter_;
  int32_t held_close_id_;  // find_held_close_id
  // Built at the first request that asks for structured output (the tokenizer's byte strings and
  // their trie take tens of ms at 152K tokens); thread-safe after.
  std::once_flag compiler_once_;
  std::unique_ptr<structured::Compiler> compiler_;
};

// Prometheus text exposition (version 0.0.4) of the engine's metrics, labelled with the model.
std::string render_metrics(EngineMetrics& metrics, const std::string& model_name);

}  // namespace megadecode
