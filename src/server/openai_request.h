// Parsing and validating the JSON of /v1/completions and /v1/chat/completions into one request
// description (no tokenization yet; the chat-only fields are chat_request.h). Every malformed
// field is an ApiError 400 naming the field; unknown fields are ignored (as vLLM does); features
// we do not support are refused by name. Threading: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/chat_request.h"
#include "server/request_json.h"
#include "server/structured_request.h"

namespace megadecode {

enum class Endpoint { kCompletions, kChat };

struct PromptInput {
  std::optional<std::string> text;  // a text prompt, or
  std::vector<int32_t> tokens;      // a token-id prompt
};

// Sampling fields as given; unset ones take the server defaults (generation_config.json), then
// the OpenAI defaults.
struct SamplingFields {
  std::optional<float> temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int> top_k;
  std::optional<int64_t> seed;
};

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::optional<std::string> model;
  std::vector<PromptInput> prompts;   // completions: one or more prompts
  ChatRequest chat;                   // chat
  bool add_special_tokens = false;    // tokenizer flag (vLLM: true for completions, false for chat)
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage_stats = false;
  std::optional<int64_t> max_tokens;  // >= 1; the context bound is the service's check
  int64_t min_tokens = 0;
  SamplingFields sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;
  std::optional<int> logprobs;  // completions: top count; chat: top_logprobs when logprobs is true
  bool echo = false;            // completions
  std::optional<StructuredOutput> structured;  // response_format / structured_outputs (structured_request.h)
};

// Throws ApiError (400) for anything malformed.
OpenAiRequest parse_generate_request(const RequestJson& body, Endpoint endpoint);
// The JSON body, or ApiError 400 when it is not a JSON object.
RequestJson parse_json_body(const std::string& body);

}  // namespace megadecode
