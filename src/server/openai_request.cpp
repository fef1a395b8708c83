// Request parsing and validation for the generation endpoints (see openai_request.h).
#include "server/openai_request.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "server/api_error.h"

namespace megadecode {

using json = RequestJson;

namespace {

constexpr int kMaxN = 128;
constexpr int kMaxLogprobs = 20;
constexpr size_t kMaxStopStrings = 64;

std::optional<int64_t> get_int(const json& body, const char* name) {
  const json* v = request_field(body, name);
  if (v == nullptr) return std::nullopt;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(kMax))
      throw bad_request(cat("'", name, "' must be at most ", kMax, ", got ", v->get<uint64_t>()), name);
    return v->get<int64_t>();
  }
  if (v->is_number_float()) {  // 5.0 is an integer, 5.5 is not (pydantic's lax mode)
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d)) {
      if (std::fabs(d) < 9.0e18) return static_cast<int64_t>(d);
      throw bad_request(cat("'", name, "' must be between ", -kMax, " and ", kMax, ", got ", v->dump()), name);
    }
  }
  throw bad_request(cat("'", name, "' must be an integer"), name);
}

// An integer field in [lo, hi]; out of range is a 400 whose message names the bound it crosses.
std::optional<int64_t> get_int_in(const json& body, const char* name, int64_t lo, int64_t hi) {
  auto v = get_int(body, name);
  if (!v) return std::nullopt;
  if (*v < lo || *v > hi) {
    if (hi == std::numeric_limits<int64_t>::max()) throw bad_request(cat("'", name, "' must be at least ", lo, ", got ", *v), name);
    throw bad_request(cat("'", name, "' must be between ", lo, " and ", hi, ", got ", *v), name);
  }
  return v;
}

// get_int_in for a field that fits an int.
std::optional<int> get_small_int(const json& body, const char* name, int lo, int hi) {
  auto v = get_int_in(body, name, lo, hi);
  if (!v) return std::nullopt;
  return static_cast<int>(*v);
}

// A number field; its range is the sampling contract's (sampling::validate, after the defaults).
std::optional<float> get_float(const json& body, const char* name) {
  const json* v = request_field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) throw bad_request(cat("'", name, "' must be a number"), name);
  return static_cast<float>(v->get<double>());
}

std::vector<int32_t> token_list(const json& v, const char* name) {
  std::vector<int32_t> out;
  out.reserve(v.size());
  for (const json& t : v) {
    if (!t.is_number_integer() || (!t.is_number_unsigned() && t.get<int64_t>() < 0))
      throw bad_request(cat("'", name, "' must hold non-negative integer token ids"), name);
    if (t.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))  // no vocabulary is this large
      throw bad_request(cat("'", name, "': token id ", t.dump(), " is out of vocabulary"), name);
    out.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return out;
}

std::vector<PromptInput> parse_prompt(const json& body) {
  const json* v = request_field(body, "prompt");
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

void refuse_unsupported(const json& body, Endpoint endpoint) {
  auto set = [&](const char* name) {
    const json* v = request_field(body, name);
    return v != nullptr && !(v->is_object() && v->empty()) && !(v->is_array() && v->empty());
  };
  for (const char* name : {"logit_bias", "functions", "function_call", "suffix", "prompt_logprobs", "guided_grammar",
                           "allowed_token_ids", "bad_words", "chat_template"})
    if (set(name)) throw bad_request(cat("'", name, "' is not supported by this server"), name);
  if (endpoint == Endpoint::kCompletions)
    for (const char* name : {"tools", "tool_choice", "documents"})
      if (set(name)) throw bad_request(cat("'", name, "' is a chat field: use /v1/chat/completions"), name);
  // vLLM's extensions that change a response when given other than their default: refused, since
  // this server would silently not do them (fields vLLM itself ignores are ignored here too).
  const std::pair<const char*, json> kVllmExtras[] = {
      {"use_beam_search", false}, {"length_penalty", 1.0}, {"truncate_prompt_tokens", nullptr},
      {"return_tokens_as_token_ids", false}, {"return_token_ids", false}, {"logits_processors", nullptr},
      {"priority", 0}, {"spaces_between_special_tokens", true}, {"mm_processor_kwargs", nullptr},
      {"prompt_embeds", nullptr}, {"kv_transfer_params", nullptr}, {"vllm_xargs", nullptr}};
  for (const auto& [name, default_value] : kVllmExtras) {
    const json* v = request_field(body, name);
    if (v != nullptr && *v != default_value) throw bad_request(cat("'", name, "' is not supported by this server"), name);
  }
  if (endpoint == Endpoint::kChat && request_bool(body, "echo").value_or(false))
    throw bad_request("'echo' is not supported for chat completions", "echo");
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

OpenAiRequest parse_generate_request(const json& body, Endpoint endpoint) {
  OpenAiRequest r;
  r.endpoint = endpoint;
  refuse_unsupported(body, endpoint);
  if (const json* v = request_field(body, "model")) {
    if (!v->is_string()) throw bad_request("'model' must be a string", "model");
    r.model = v->get<std::string>();
  }
  if (endpoint == Endpoint::kCompletions) {
    r.prompts = parse_prompt(body);
    r.add_special_tokens = request_bool(body, "add_special_tokens").value_or(true);
    r.echo = request_bool(body, "echo").value_or(false);
    r.logprobs = get_small_int(body, "logprobs", 0, kMaxLogprobs);
    if (r.logprobs && request_field(body, "logprobs")->is_boolean()) throw bad_request("'logprobs' must be an integer", "logprobs");
  } else {
    r.chat = parse_chat_request(body);
    r.add_special_tokens = request_bool(body, "add_special_tokens").value_or(false);
    const bool want = request_bool(body, "logprobs").value_or(false);
    auto top = get_small_int(body, "top_logprobs", 0, kMaxLogprobs);
    if (top && !want) throw bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
    if (want) r.logprobs = top.value_or(0);
  }
  r.n = get_small_int(body, "n", 1, kMaxN).value_or(1);
  r.stream = request_bool(body, "stream").value_or(false);
  if (const json* so = request_field(body, "stream_options")) {
    if (!r.stream) throw bad_request("Stream options can only be defined when `stream=True`.", "stream_options");
    if (!so->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    r.include_usage = request_bool(*so, "include_usage").value_or(false);
    r.continuous_usage_stats = request_bool(*so, "continuous_usage_stats").value_or(false);
  }
  // max_completion_tokens is the newer name; it wins when both are given. Their upper bound is the
  // context left after the prompt, checked (and named) once the prompt is tokenized.
  constexpr int64_t kNoBound = std::numeric_limits<int64_t>::max();
  auto max_tokens = get_int_in(body, "max_tokens", 1, kNoBound);
  auto max_completion = get_int_in(body, "max_completion_tokens", 1, kNoBound);
  r.max_tokens = max_completion ? max_completion : max_tokens;
  r.min_tokens = get_int_in(body, "min_tokens", 0, kNoBound).value_or(0);
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
  s.top_k = get_small_int(body, "top_k", -1, std::numeric_limits<int>::max());  // -1 and 0: off
  s.seed = get_int(body, "seed");

  if (const json* v = request_field(body, "stop")) {
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
  if (const json* v = request_field(body, "stop_token_ids")) {
    if (!v->is_array()) throw bad_request("'stop_token_ids' must be a list of token ids", "stop_token_ids");
    r.stop_token_ids = token_list(*v, "stop_token_ids");
  }
  r.ignore_eos = request_bool(body, "ignore_eos").value_or(false);
  r.skip_special_tokens = request_bool(body, "skip_special_tokens").value_or(true);
  r.include_stop_str_in_output = request_bool(body, "include_stop_str_in_output").value_or(false);
  if (const json* v = request_field(body, "user"); v != nullptr && !v->is_string())
    throw bad_request("'user' must be a string", "user");
  r.structured = parse_structured_output(body);
  return r;
}

}  // namespace megadecode
