// OpenAiService: routing, validation against the model, request submission (see openai_service.h).
#include "server/openai_service.h"

#include <algorithm>
#include <chrono>
#include <random>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/log.h"
#include "core/rng.h"
#include "sampling/params.h"
#include "server/api_error.h"
#include "server/forced_tool_call.h"
#include "server/generation_state.h"
#include "structured/framed.h"
#include "structured/reasoning.h"

namespace megadecode {

using nlohmann::json;

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string random_hex(uint64_t a, uint64_t b) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(a), static_cast<unsigned long long>(b));
  return buf;
}

void respond_json(const std::shared_ptr<Exchange>& exchange, int status, const json& body) {
  exchange->respond(status, "application/json", dump_json(body));
}

void respond_error(const std::shared_ptr<Exchange>& exchange, const ApiError& e, const HttpHeaders& headers = {}) {
  exchange->respond(e.status, "application/json", e.body(), headers);
}

}  // namespace

OpenAiService::OpenAiService(Engine& engine, ServedModel model, ApiKeyGuard api_key)
    : engine_(engine), model_(std::move(model)), api_key_(std::move(api_key)), started_at_(unix_now()),
      seed_counter_(std::random_device{}()), held_close_id_(find_held_close_id(model_)) {}

uint64_t OpenAiService::fresh_seed() { return mix64(seed_counter_.fetch_add(1) + 0x51ed); }

void OpenAiService::handle(HttpRequest&& request, std::shared_ptr<Exchange> exchange) {
  const std::string& p = request.path;
  const std::string& m = request.method;
  struct Route {
    const char* path;
    const char* method;
  };
  static constexpr Route kRoutes[] = {{"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
                                      {"/v1/models", "GET"},       {"/health", "GET"},
                                      {"/metrics", "GET"},         {"/version", "GET"},
                                      {"/tokenize", "POST"},       {"/detokenize", "POST"}};
  try {
    if (api_key_.protects(p) && !api_key_.accepts(request.authorization)) {
      respond_error(exchange, invalid_api_key(), {{"WWW-Authenticate", "Bearer"}});
      return;
    }
    const Route* route = nullptr;
    for (const Route& r : kRoutes)
      if (p == r.path) route = &r;
    if (route == nullptr) throw not_found(cat("Invalid URL (", m, " ", p, ")"), std::nullopt, "unknown_url");
    const bool get = std::string_view(route->method) == "GET";
    if (m != route->method && !(get && m == "HEAD")) {  // HEAD: the GET answer's headers (the HTTP layer drops the body)
      respond_error(exchange, ApiError(405, cat("Method ", m, " is not allowed for ", p), "invalid_request_error"),
                    {{"Allow", get ? "GET, HEAD" : route->method}});
      return;
    }
    if (!get && !is_json_media_type(request.content_type))
      throw ApiError(415, cat("Unsupported Media Type: only 'application/json' is allowed (the request's Content-Type is ",
                              request.content_type.empty() ? std::string("missing") : "'" + request.content_type + "'", ")"),
                     "invalid_request_error");
    if (p == "/v1/completions") return generate(request, exchange, Endpoint::kCompletions);
    if (p == "/v1/chat/completions") return generate(request, exchange, Endpoint::kChat);
    if (p == "/v1/models") return models(exchange);
    if (p == "/health") return exchange->respond(engine_.running() ? 200 : 503, "", "");  // 503: draining or failed
    if (p == "/metrics") return metrics(exchange);
    if (p == "/version") return respond_json(exchange, 200, json{{"version", "megadecode 0.1"}});
    if (p == "/tokenize") return tokenize(request, exchange);
    if (p == "/detokenize") return detokenize(request, exchange);
  } catch (const ApiError& e) {
    respond_error(exchange, e);
  } catch (const json::exception& e) {
    // A body the validation did not foresee (nlohmann type errors): still the client's fault.
    respond_error(exchange, bad_request(cat("Invalid request: ", e.what())));
  } catch (const Error& e) {
    respond_error(exchange, bad_request(e.what()));
  }
}

void OpenAiService::check_model(const std::optional<std::string>& model) const {
  if (model && *model != model_.name)
    throw not_found(cat("The model `", *model, "` does not exist."), "model", "model_not_found");
}

void OpenAiService::require_tokenizer(const char* what, const char* param) const {
  if (model_.tokenizer == nullptr)
    throw bad_request(cat("this server runs with --skip-tokenizer-init: ", what),
                      param != nullptr ? std::optional<std::string>(param) : std::nullopt);
}

// Every generation field that needs text, refused by name when there is no tokenizer.
void OpenAiService::refuse_text_fields(const OpenAiRequest& r) const {
  if (r.endpoint == Endpoint::kChat) require_tokenizer("chat completions need a tokenizer", "messages");
  for (const PromptInput& p : r.prompts)
    if (p.text) require_tokenizer("prompts must be token ids", "prompt");
  if (r.echo) require_tokenizer("'echo' needs a tokenizer", "echo");
  if (!r.stop.empty()) require_tokenizer("'stop' strings need a tokenizer (stop_token_ids work)", "stop");
  if (r.logprobs) require_tokenizer("'logprobs' needs a tokenizer", "logprobs");
  if (r.structured) require_tokenizer("structured output needs a tokenizer", r.structured->field.c_str());
}

structured::Compiler& OpenAiService::compiler() {
  std::call_once(compiler_once_, [&] {
    compiler_ = std::make_unique<structured::Compiler>(
        structured::Vocabulary::from_tokenizer(*model_.tokenizer, model_.eos_token_ids));
  });
  return *compiler_;
}

std::vector<std::shared_ptr<TokenConstraint>> OpenAiService::constraints(const StructuredOutput& so,
                                                                         const ChatOutputOptions& chat_output, bool chat,
                                                                         int n) {
  try {
    compiler().compile(so.spec);  // once a request: every sequence's make() finds it cached
  } catch (const Error& e) {  // SchemaError names the keyword and its JSON pointer
    throw bad_request(cat("'", so.field, "' cannot be enforced: ", e.what()), so.field);
  }
  // The grammar starts once the reasoning ends (vLLM): Qwen3's </think>, cmd4's <|END_THINKING|>.
  std::vector<int32_t> end_of_reasoning;
  if (chat && chat_output.reasoning)
    end_of_reasoning = model_.tokenizer->encode(
        chat_output.reasoning_format == ReasoningFormat::kCohereCommand4 ? "<|END_THINKING|>" : "</think>", false);
  std::vector<std::shared_ptr<TokenConstraint>> out;
  for (int i = 0; i < n; ++i) {
    std::shared_ptr<TokenConstraint> c = compiler_->make(so.spec);
    if (!end_of_reasoning.empty())
      c = std::make_shared<structured::AfterReasoning>(std::move(c), end_of_reasoning, model_.tokenizer->vocab_size(),
                                                       model_.eos_token_ids);
    out.push_back(std::move(c));
  }
  return out;
}

int32_t OpenAiService::find_held_close_id(const ServedModel& model) {
  if (model.tokenizer == nullptr || !model.chat.tool_format) return -1;
  const std::vector<int32_t> ids = model.tokenizer->encode(held_call_close(*model.chat.tool_format), false);
  return ids.size() == 1 ? ids[0] : -1;
}

std::vector<std::shared_ptr<TokenConstraint>> OpenAiService::call_constraints(const ChatRequest& chat, int n) {
  const std::vector<ForcedTool> tools = forced_tools(chat.tool_choice, chat.input.tools);
  MD_REQUIRE(!tools.empty(), "a forced tool call without its tool");  // parse_tool_choice checked the name
  const ToolCallFormat format = *model_.chat.tool_format;
  for (const ForcedTool& t : tools) {  // each alone first, so that an error names the tool's own pointer
    try {
      compiler().compile(structured::Spec::json_schema(t.parameters.dump()));
      if (format == ToolCallFormat::kQwen3Coder)  // and what the XML form adds (its pointers are the tool's own)
        compiler().compile(forced_call_spec(format, {t}, chat.parallel_tool_calls));
    } catch (const Error& e) {
      throw bad_request(cat("'tools' [", t.index, "] (function '", t.name, "'): its parameters cannot be enforced: ",
                            e.what()),
                        "tools");
    }
  }
  const structured::Spec spec = forced_call_spec(format, tools, chat.parallel_tool_calls);
  try {
    compiler().compile(spec);
  } catch (const Error& e) {
    throw bad_request(cat("the forced tool call cannot be enforced: ", e.what()), "tools");
  }
  const int32_t close = held_close_id_;
  std::vector<std::shared_ptr<TokenConstraint>> out;
  for (int i = 0; i < n; ++i)
    out.push_back(std::make_shared<structured::Framed>(compiler().make(spec), std::vector<int32_t>{},
                                                       std::vector<int32_t>{close}, model_.tokenizer->vocab_size(),
                                                       model_.eos_token_ids));
  return out;
}

// Ids a prompt may hold: the tokenizer's (a model's vocabulary is often padded past it, and vLLM
// refuses the ids no token has), else the model's.
int OpenAiService::prompt_vocab_size() const {
  const int model_vocab = engine_.vocab_size();
  return model_.tokenizer != nullptr ? std::min(model_vocab, model_.tokenizer->vocab_size()) : model_vocab;
}

std::vector<int32_t> OpenAiService::encode(const std::string& text, bool add_special_tokens) const {
  try {
    return model_.tokenizer->encode(text, add_special_tokens);
  } catch (const Error& e) {
    throw bad_request(cat("The prompt cannot be tokenized: ", e.what()), "prompt");
  }
}

void OpenAiService::generate(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange, Endpoint endpoint) {
  const RequestJson body = parse_json_body(request.body);
  OpenAiRequest r = parse_generate_request(body, endpoint);
  check_model(r.model);
  refuse_text_fields(r);
  const bool chat = endpoint == Endpoint::kChat;
  const int vocab = engine_.vocab_size();
  const int prompt_vocab = prompt_vocab_size();
  const int max_len = engine_.max_model_len();

  GenerationSetup setup;
  setup.endpoint = endpoint;
  setup.model = model_.name;
  setup.created = unix_now();
  setup.stream = r.stream;
  setup.include_usage = r.include_usage;
  setup.continuous_usage_stats = r.continuous_usage_stats;
  setup.n = r.n;
  setup.echo = r.echo;
  setup.logprobs = r.logprobs;
  setup.token_ids = model_.tokenizer == nullptr;
  const uint64_t id_bits = fresh_seed();
  setup.id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(id_bits, mix64(id_bits));
  setup.id_bits = id_bits;

  // A forced call is held to its tools' schemas (not beside another structured output, which is
  // refused below) where the format's closing tag is one token.
  const bool hold_calls = chat && !r.structured &&
                          (r.chat.tool_choice.kind == ToolChoice::Kind::kRequired ||
                           r.chat.tool_choice.kind == ToolChoice::Kind::kFunction) &&
                          held_close_id_ >= 0;
  if (chat) {
    const std::string text = prepare_chat(r.chat, model_.chat, &setup.chat_output, hold_calls);
    setup.prompts.push_back(encode(text, r.add_special_tokens));
  } else {
    for (const PromptInput& p : r.prompts) {
      if (p.text) {
        setup.prompts.push_back(encode(*p.text, r.add_special_tokens));
        if (r.echo) setup.echo_text.push_back(*p.text);
      } else {
        for (int32_t t : p.tokens)
          if (t >= prompt_vocab)
            throw bad_request(cat("Token id ", t, " is out of vocabulary: prompt token ids must be below ", prompt_vocab),
                              "prompt");
        setup.prompts.push_back(p.tokens);
        if (r.echo) setup.echo_text.push_back(model_.tokenizer->decode(p.tokens, false));
      }
    }
  }
  for (int32_t t : r.stop_token_ids)
    if (t >= vocab) throw bad_request(cat("stop_token_ids: token id ", t, " is out of vocabulary (size ", vocab, ")"), "stop_token_ids");

  // Length checks and max_tokens, per prompt (vLLM's messages and defaults).
  const char* input_name = chat ? "messages" : "prompt";
  std::vector<int> max_tokens;
  for (const auto& prompt : setup.prompts) {
    const int n = static_cast<int>(prompt.size());
    if (n == 0) throw bad_request("The prompt cannot be empty", input_name);
    if (n >= max_len)
      throw bad_request(cat("This model's maximum context length is ", max_len, " tokens. However, your request has ", n,
                            " input tokens. Please reduce the length of the input ", chat ? "messages." : "prompt."),
                        input_name, "context_length_exceeded");
    const int room = max_len - n;
    if (r.max_tokens) {
      if (*r.max_tokens > room)  // the bound named is the context left
        throw bad_request(cat("'max_tokens' or 'max_completion_tokens' is too large: ", *r.max_tokens,
                              ". This model's maximum context length is ", max_len, " tokens and your request has ", n,
                              " input tokens (", *r.max_tokens, " > ", max_len, " - ", n, ")."),
                          "max_tokens", "context_length_exceeded");
      max_tokens.push_back(static_cast<int>(*r.max_tokens));
    } else {
      // Completions default to 16 tokens, chat to the rest of the context; generation_config's
      // max_new_tokens replaces either; never more than fits.
      int d = model_.defaults.max_new_tokens.value_or(chat ? room : 16);
      max_tokens.push_back(std::max(1, std::min(d, room)));
    }
    if (r.min_tokens > max_tokens.back())
      throw bad_request(cat("'min_tokens' (", r.min_tokens, ") must not exceed 'max_tokens' (", max_tokens.back(), ")"),
                        "min_tokens");
  }

  const SamplingParams sampling = resolve_sampling(r.sampling, model_.defaults.sampling);
  try {
    sampling::validate(sampling);
  } catch (const sampling::ParamError& e) {
    throw bad_request(e.what(), e.field());
  }
  std::vector<std::shared_ptr<TokenConstraint>> constraint;  // one a sequence, with structured output
  if (r.structured) {
    if (chat && !setup.chat_output.primed.empty())
      throw bad_request(cat("'", r.structured->field, "' cannot be combined with a required or named 'tool_choice'"),
                        r.structured->field);
    constraint = constraints(*r.structured, setup.chat_output, chat, static_cast<int>(setup.prompts.size()) * r.n);
  }
  if (hold_calls) constraint = call_constraints(r.chat, static_cast<int>(setup.prompts.size()) * r.n);
  const uint64_t request_id = engine_.new_request_id();
  auto state = std::make_shared<GenerationState>(setup, model_.tokenizer, exchange);
  std::vector<SequenceRequest> seqs;
  const auto arrival = Clock::now();
  for (size_t p = 0; p < setup.prompts.size(); ++p) {
    for (int i = 0; i < r.n; ++i) {
      SequenceRequest s;
      s.request_id = request_id;
      s.index = static_cast<int>(p) * r.n + i;
      s.prompt = setup.prompts[p];
      s.sampling = sampling;
      // vLLM's rule for n > 1: choice i samples with seed + i; without a seed, a fresh one each.
      s.sampling.seed = r.sampling.seed ? static_cast<uint64_t>(*r.sampling.seed) + i : fresh_seed();
      s.stop.max_tokens = max_tokens[p];
      s.stop.min_tokens = static_cast<int>(r.min_tokens);  // <= max_tokens, checked above
      s.stop.stop = r.stop;
      s.stop.stop_token_ids = r.stop_token_ids;
      s.stop.eos_token_ids = model_.eos_token_ids;
      s.stop.ignore_eos = r.ignore_eos;
      s.stop.include_stop_str_in_output = r.include_stop_str_in_output;
      // cmd4's parsers read its markers, which are special tokens.
      s.stop.skip_special_tokens = r.skip_special_tokens && !(chat && setup.chat_output.is_cmd4());
      s.logprobs = r.logprobs.value_or(-1);
      s.prompt_logprobs = r.echo && r.logprobs.has_value();
      s.arrival = arrival;
      s.sink = state;
      if (!constraint.empty()) s.constraint = constraint[s.index];
      seqs.push_back(std::move(s));
    }
  }
  SubmitStatus status;
  try {
    status = engine_.submit(std::move(seqs));
  } catch (const Error& e) {
    throw bad_request(e.what());
  }
  if (status != SubmitStatus::kOk) {
    const char* message = status == SubmitStatus::kQueueFull
                              ? "The server is overloaded: the waiting queue is full. Retry later."
                          : status == SubmitStatus::kFailed ? "The server's engine has failed and is restarting. Retry later."
                                                            : "The server is shutting down. Retry later.";
    respond_error(exchange, ApiError(503, message, "server_error"), {{"Retry-After", "1"}});
    return;
  }
  // Events from the engine are posted to this connection's strand, which is running this
  // handler: none can overtake the stream's headers sent here.
  state->begin();
  exchange->on_client_gone([&engine = engine_, request_id] { engine.abort(request_id); });
}

void OpenAiService::tokenize(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
  require_tokenizer("/tokenize needs a tokenizer", nullptr);
  const RequestJson body = parse_json_body(request.body);
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) throw bad_request("'model' must be a string", "model");
    check_model(it->get<std::string>());
  }
  auto flag = [&](const char* name, bool fallback) { return request_bool(body, name).value_or(fallback); };
  std::vector<int32_t> tokens;
  if (body.contains("messages")) {
    tokens = encode(render_chat(parse_chat_request(body).input, model_.chat), flag("add_special_tokens", false));
  } else if (auto p = body.find("prompt"); p != body.end() && p->is_string()) {
    tokens = encode(p->get<std::string>(), flag("add_special_tokens", true));
  } else {
    throw bad_request("/tokenize needs a string 'prompt' or a list of 'messages'", "prompt");
  }
  json out = {{"count", tokens.size()}, {"max_model_len", engine_.max_model_len()}, {"tokens", tokens}};
  if (flag("return_token_strs", false)) {
    json strs = json::array();
    for (int32_t t : tokens) strs.push_back(model_.tokenizer->decode(std::span<const int32_t>(&t, 1), false));
    out["token_strs"] = std::move(strs);
  }
  respond_json(exchange, 200, out);
}

void OpenAiService::detokenize(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
  require_tokenizer("/detokenize needs a tokenizer", nullptr);
  const RequestJson body = parse_json_body(request.body);
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) throw bad_request("'model' must be a string", "model");
    check_model(it->get<std::string>());
  }
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) throw bad_request("'tokens' must be a list of token ids", "tokens");
  std::vector<int32_t> tokens;
  const int vocab = prompt_vocab_size();
  for (const RequestJson& t : *it) {
    const bool in_range = t.is_number_unsigned() ? t.get<uint64_t>() < static_cast<uint64_t>(vocab)
                                                 : t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab;
    if (!in_range)
      throw bad_request(cat("'tokens' must hold token ids in [0, ", vocab, "), got ", t.dump()), "tokens");
    tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  respond_json(exchange, 200, json{{"prompt", model_.tokenizer->decode(tokens, false)}});
}

void OpenAiService::models(const std::shared_ptr<Exchange>& exchange) {
  json card = {{"id", model_.name},          {"object", "model"},   {"created", started_at_},
               {"owned_by", "megadecode"},   {"root", model_.root}, {"parent", nullptr},
               {"max_model_len", engine_.max_model_len()}};
  respond_json(exchange, 200, json{{"object", "list"}, {"data", json::array({card})}});
}

void OpenAiService::metrics(const std::shared_ptr<Exchange>& exchange) {
  exchange->respond(200, "text/plain; version=0.0.4; charset=utf-8", render_metrics(engine_.metrics(), model_.name));
}

}  // namespace megadecode
