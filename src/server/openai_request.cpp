// Request parsing and validation for the generation endpoints (see openai_request.h).
#include "server/openai_request.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "server/api_error.h"

namespace megadecode {

using nlohmann::json;

namespace {

constexpr int kMaxN = 128;
constexpr int kMaxLogprobs = 20;
constexpr size_t kMaxStopStrings = 64;

const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<bool> get_bool(const json& body, const char* name) {
  const json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(cat("'", name, "' must be a boolean"), name);
  return v->get<bool>();
}

std::optional<int64_t> get_int(const json& body, const char* name) {
  const json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw bad_request(cat("'", name, "' is out of range"), name);
    return v->get<int64_t>();
  }
  if (v->is_number_float()) {  // 5.0 is an integer, 5.5 is not (pydantic's lax mode)
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) return static_cast<int64_t>(d);
  }
  throw bad_request(cat("'", name, "' must be an integer"), name);
}

std::optional<int> get_int_in(const json& body, const char* name, int64_t lo, int64_t hi, const char* range) {
  auto v = get_int(body, name);
  if (!v) return std::nullopt;
  if (*v < lo || *v > hi) throw bad_request(cat("'", name, "' must be ", range, ", got ", *v), name);
  return static_cast<int>(*v);
}

// A number field; its range is the sampling contract's (sampling::validate, after the defaults).
std::optional<float> get_float(const json& body, const char* name) {
  const json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) throw bad_request(cat("'", name, "' must be a number"), name);
  return static_cast<float>(v->get<double>());
}

std::vector<int32_t> token_list(const json& v, const char* name) {
  std::vector<int32_t> out;
  out.reserve(v.size());
  for (const json& t : v) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw bad_request(cat("'", name, "' must hold non-negative integer token ids"), name);
    out.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return out;
}

std::vector<PromptInput> parse_prompt(const json& body) {
  const json* v = field(body, "prompt");
  if (v == nullptr) throw bad_request("'prompt' is required", "prompt");
  std::vector<PromptInput> out;
  if (v->is_string()) {
    out.push_back(PromptInput{v->get<std::string>(), {}});
  } else if (v->is_array()) {
    if (v->empty()) throw bad_request("'prompt' must not be empty", "prompt");
    if ((*v)[0].is_number()) {
      out.push_back(PromptInput{std::nullopt, token_list(*v, "prompt")});
    } else {
      for (const json& p : *v) {
        if (p.is_string()) {
          out.push_back(PromptInput{p.get<std::string>(), {}});
        } else if (p.is_array()) {
          if (p.empty()) throw bad_request("'prompt' must not contain an empty token list", "prompt");
          out.push_back(PromptInput{std::nullopt, token_list(p, "prompt")});
        } else {
          throw bad_request("'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists",
                            "prompt");
        }
      }
    }
  } else {
    throw bad_request("'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists",
                      "prompt");
  }
  for (const PromptInput& p : out)
    if ((p.text && p.text->empty()) || (!p.text && p.tokens.empty()))
      throw bad_request("The prompt cannot be empty", "prompt");
  return out;
}

std::string message_content(const json& m) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) throw bad_request("message 'content' must be a string or a list of content parts", "messages");
  std::string text;
  bool first = true;
  for (const json& part : *it) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw bad_request("each content part must be an object with a 'type'", "messages");
    if (part["type"] != "text")
      throw bad_request(cat("content parts of type '", part["type"].get<std::string>(), "' are not supported"),
                        "messages");
    if (!part.contains("text") || !part["text"].is_string())
      throw bad_request("a text content part needs a string 'text'", "messages");
    if (!first) text += "\n";  // vLLM joins text parts with newlines
    text += part["text"].get<std::string>();
    first = false;
  }
  return text;
}

void refuse_unsupported(const json& body) {
  auto set = [&](const char* name) {
    const json* v = field(body, name);
    return v != nullptr && !(v->is_object() && v->empty()) && !(v->is_array() && v->empty());
  };
  for (const char* name : {"logit_bias", "tools", "functions", "suffix", "prompt_logprobs", "guided_json",
                           "guided_regex", "guided_choice", "structured_outputs", "allowed_token_ids", "bad_words"})
    if (set(name)) throw bad_request(cat("'", name, "' is not supported by this server"), name);
  if (const json* v = field(body, "response_format")) {
    if (!v->is_object() || !v->contains("type") || (*v)["type"] != "text")
      throw bad_request("only response_format {\"type\": \"text\"} is supported", "response_format");
  }
  if (const json* v = field(body, "tool_choice")) {
    if (!(v->is_string() && v->get<std::string>() == "none"))
      throw bad_request("'tool_choice' is not supported by this server", "tool_choice");
  }
  if (auto best_of = get_int(body, "best_of"); best_of && *best_of != 1 && *best_of != get_int(body, "n").value_or(1))
    throw bad_request("'best_of' is not supported by this server", "best_of");
}

}  // namespace

json parse_json_body(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) throw bad_request("The request body is not valid JSON");
  if (!j.is_object()) throw bad_request("The request body must be a JSON object");
  return j;
}

std::vector<ChatMessage> parse_messages(const json& v) {
  if (!v.is_array()) throw bad_request("'messages' must be a list of messages", "messages");
  if (v.empty()) throw bad_request("'messages' must not be empty", "messages");
  std::vector<ChatMessage> out;
  for (const json& m : v) {
    if (!m.is_object()) throw bad_request("each message must be an object", "messages");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) throw bad_request("each message needs a string 'role'", "messages");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's newer name for system instructions
    if (r != "system" && r != "user" && r != "assistant")
      throw bad_request(cat("message role '", r, "' is not supported (system, user, assistant)"), "messages");
    out.push_back(ChatMessage{r, message_content(m)});
  }
  return out;
}

OpenAiRequest parse_generate_request(const json& body, Endpoint endpoint) {
  OpenAiRequest r;
  r.endpoint = endpoint;
  refuse_unsupported(body);
  if (const json* v = field(body, "model")) {
    if (!v->is_string()) throw bad_request("'model' must be a string", "model");
    r.model = v->get<std::string>();
  }
  if (endpoint == Endpoint::kCompletions) {
    r.prompts = parse_prompt(body);
    r.add_special_tokens = get_bool(body, "add_special_tokens").value_or(true);
    r.echo = get_bool(body, "echo").value_or(false);
    r.logprobs = get_int_in(body, "logprobs", 0, kMaxLogprobs, "between 0 and 20");
    if (r.logprobs && field(body, "logprobs")->is_boolean()) throw bad_request("'logprobs' must be an integer", "logprobs");
  } else {
    const json* m = field(body, "messages");
    if (m == nullptr) throw bad_request("'messages' is required", "messages");
    r.messages = parse_messages(*m);
    r.add_generation_prompt = get_bool(body, "add_generation_prompt").value_or(true);
    r.add_special_tokens = get_bool(body, "add_special_tokens").value_or(false);
    const bool want = get_bool(body, "logprobs").value_or(false);
    auto top = get_int_in(body, "top_logprobs", 0, kMaxLogprobs, "between 0 and 20");
    if (top && !want) throw bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
    if (want) r.logprobs = top.value_or(0);
  }
  r.n = get_int_in(body, "n", 1, kMaxN, "between 1 and 128").value_or(1);
  r.stream = get_bool(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!r.stream) throw bad_request("Stream options can only be defined when `stream=True`.", "stream_options");
    if (!so->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
    r.continuous_usage_stats = get_bool(*so, "continuous_usage_stats").value_or(false);
  }
  // max_completion_tokens is the newer name; it wins when both are given.
  auto max_tokens = get_int_in(body, "max_tokens", 1, std::numeric_limits<int>::max(), "at least 1");
  auto max_completion = get_int_in(body, "max_completion_tokens", 1, std::numeric_limits<int>::max(), "at least 1");
  r.max_tokens = max_completion ? max_completion : max_tokens;
  r.min_tokens = get_int_in(body, "min_tokens", 0, std::numeric_limits<int>::max(), "non-negative").value_or(0);
  if (r.max_tokens && r.min_tokens > *r.max_tokens)
    throw bad_request(cat("'min_tokens' (", r.min_tokens, ") must not exceed 'max_tokens' (", *r.max_tokens, ")"),
                      "min_tokens");

  SamplingFields& s = r.sampling;
  s.temperature = get_float(body, "temperature");
  s.top_p = get_float(body, "top_p");
  s.min_p = get_float(body, "min_p");
  s.presence_penalty = get_float(body, "presence_penalty");
  s.frequency_penalty = get_float(body, "frequency_penalty");
  s.repetition_penalty = get_float(body, "repetition_penalty");
  if (auto k = get_int(body, "top_k")) {
    if (*k < std::numeric_limits<int>::min() || *k > std::numeric_limits<int>::max())
      throw bad_request(cat("'top_k' is out of range, got ", *k), "top_k");
    s.top_k = static_cast<int>(*k);
  }
  s.seed = get_int(body, "seed");

  if (const json* v = field(body, "stop")) {
    if (v->is_string()) {
      r.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const json& x : *v) {
        if (!x.is_string()) throw bad_request("'stop' must be a string or a list of strings", "stop");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      throw bad_request("'stop' must be a string or a list of strings", "stop");
    }
    if (r.stop.size() > kMaxStopStrings) throw bad_request("'stop' holds more than 64 strings", "stop");
  }
  if (const json* v = field(body, "stop_token_ids")) {
    if (!v->is_array()) throw bad_request("'stop_token_ids' must be a list of token ids", "stop_token_ids");
    r.stop_token_ids = token_list(*v, "stop_token_ids");
  }
  r.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  r.skip_special_tokens = get_bool(body, "skip_special_tokens").value_or(true);
  r.include_stop_str_in_output = get_bool(body, "include_stop_str_in_output").value_or(false);
  if (const json* v = field(body, "user"); v != nullptr && !v->is_string())
    throw bad_request("'user' must be a string", "user");
  return r;
}

}  // namespace megadecode
