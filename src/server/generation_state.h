// One /v1/completions or /v1/chat/completions request while it generates: receives the engine's
// events for its n choices (prompts x n), and writes them to the client in the OpenAI shape:
// SSE chunks as they come (stream) or one JSON response when every choice has finished. Chat
// choices go through a ChatOutputParser when the request asks for reasoning or tool calls. A
// server without a tokenizer adds the generated ids to every choice and chunk ("token_ids").
// Threading: on_output() runs on the engine's scheduler thread and only posts the event to the
// connection's strand; everything else runs on that strand.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "server/chat_output.h"
#include "server/exchange.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {

struct GenerationSetup {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;     // "cmpl-..." / "chatcmpl-..."
  std::string model;  // served model name
  int64_t created = 0;
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage_stats = false;
  int n = 1;                                 // choices per prompt
  std::vector<std::vector<int32_t>> prompts;  // [n_prompts] token ids
  std::vector<std::string> echo_text;         // [n_prompts] the prompt text with echo, else empty
  bool echo = false;
  std::optional<int> logprobs;  // top count, when logprobs were asked for
  uint64_t id_bits = 0;         // random bits behind `id` (tool-call ids derive from them)
  ChatOutputOptions chat_output;  // chat: reasoning and tool-call parsing
  // No tokenizer (--skip-tokenizer-init): completions choices carry "token_ids", the ids generated
  // (end token included, as usage counts them): in each chunk those of its event, else all.
  bool token_ids = false;
};

class GenerationState : public OutputSink, public std::enable_shared_from_this<GenerationState> {
 public:
  // `tokenizer` (token strings of logprobs) may be null when the request asks for no logprobs.
  GenerationState(GenerationSetup setup, const Tokenizer* tokenizer, std::shared_ptr<Exchange> exchange);
  // Strand: sends the stream's headers (and the chat role chunks).
  void begin();
  void on_output(SeqOutput&& output) override;

 private:
  struct Choice {
    std::string text;
    std::vector<int32_t> token_ids;  // with setup.token_ids, not streamed: every generated id
    nlohmann::json logprobs;  // completions: {tokens, token_logprobs, top_logprobs, text_offset}; chat: [entries]
    size_t text_offset = 0;
    int n_tokens = 0;
    int n_prompt = 0;
    int n_cached = 0;
    bool started = false;
    bool finished = false;
    FinishReason reason = FinishReason::kStop;
    std::optional<std::string> stop_string;
    std::optional<int32_t> stop_token;
    std::string error;
    std::unique_ptr<ChatOutputParser> parser;  // chat with reasoning or tools
    std::string reasoning;
    nlohmann::json tool_calls = nlohmann::json::array();
  };
  void handle(SeqOutput& o);
  void add_logprob(Choice& c, nlohmann::json& target, int32_t token, const TokenLogprob* lp);
  nlohmann::json new_logprobs() const;
  nlohmann::json chunk_base() const;
  nlohmann::json usage() const;
  nlohmann::json stop_reason(const Choice& c) const;
  std::string finish_reason(const Choice& c) const;
  nlohmann::json tool_call_json(size_t choice, size_t index, const ParsedToolCall& call) const;
  std::vector<nlohmann::json> chat_deltas(size_t choice, Choice& c, const std::string& text, bool finished);
  void write_chunk(const nlohmann::json& chunk);
  void finish_stream();
  void finish_response();
  std::string token_text(int32_t token) const;
  std::string token_bytes(int32_t token) const;

  GenerationSetup setup_;
  const Tokenizer* tokenizer_;
  std::shared_ptr<Exchange> exchange_;
  std::vector<Choice> choices_;
  int n_finished_ = 0;
};

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump_json(const nlohmann::json& j);

}  // namespace megadecode
