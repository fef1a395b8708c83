// GenerationState: OpenAI response and SSE chunk building for one request (see generation_state.h).
#include "server/generation_state.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/rng.h"
#include "server/api_error.h"

namespace megadecode {

using nlohmann::json;

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

namespace {

// vLLM clamps -inf log-probabilities to -9999 so that the JSON stays numeric.
json logprob_value(float v) {
  if (std::isnan(v)) return nullptr;
  return std::max(static_cast<double>(v), -9999.0);
}

json byte_list(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

}  // namespace

GenerationState::GenerationState(GenerationSetup setup, const Tokenizer* tokenizer, std::shared_ptr<Exchange> exchange)
    : setup_(std::move(setup)), tokenizer_(tokenizer), exchange_(std::move(exchange)) {
  MD_CHECK(tokenizer_ != nullptr || !setup_.logprobs, "logprobs need a tokenizer");
  choices_.resize(setup_.prompts.size() * setup_.n);
  const bool parse = setup_.endpoint == Endpoint::kChat && setup_.chat_output.active();
  for (size_t i = 0; i < choices_.size(); ++i) {
    choices_[i].logprobs = new_logprobs();
    choices_[i].n_prompt = static_cast<int>(setup_.prompts[i / setup_.n].size());
    if (parse) choices_[i].parser = std::make_unique<ChatOutputParser>(setup_.chat_output);
  }
}

json GenerationState::new_logprobs() const {
  if (setup_.endpoint == Endpoint::kChat) return json::array();
  return json{{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
}

// Ids the tokenizer does not know (a padded model vocabulary) show as empty strings.
std::string GenerationState::token_text(int32_t token) const {
  try {
    return tokenizer_->decode(std::span<const int32_t>(&token, 1), false);
  } catch (const Error&) {
    return "";
  }
}

std::string GenerationState::token_bytes(int32_t token) const {
  try {
    return tokenizer_->token_bytes(token);
  } catch (const Error&) {
    return "";
  }
}

void GenerationState::begin() {
  if (!setup_.stream) return;
  exchange_->begin_stream("text/event-stream");
  if (setup_.endpoint != Endpoint::kChat) return;
  // The first chunk of each chat choice carries the role (as OpenAI and vLLM send it).
  for (size_t i = 0; i < choices_.size(); ++i) {
    json chunk = chunk_base();
    chunk["choices"] = json::array({json{{"index", i},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}});
    write_chunk(chunk);
  }
}

void GenerationState::on_output(SeqOutput&& output) {
  // Scheduler thread: hand the event to the connection's strand and return at once.
  exchange_->post([self = shared_from_this(), o = std::move(output)]() mutable {
    try {
      self->handle(o);
    } catch (const std::exception& e) {
      // Never let a formatting failure escape into the I/O thread; fail this response instead.
      ApiError err = server_error(cat("response formatting failed: ", e.what()));
      if (self->setup_.stream) {
        self->exchange_->stream("data: " + err.body() + "\n\ndata: [DONE]\n\n");
        self->exchange_->end_stream();
      } else {
        self->exchange_->respond(err.status, "application/json", err.body());
      }
    }
  });
}

void GenerationState::add_logprob(Choice& c, json& target, int32_t token, const TokenLogprob* lp) {
  const std::string text = token_text(token);
  if (setup_.endpoint == Endpoint::kChat) {
    json entry = {{"token", text}, {"logprob", lp ? logprob_value(lp->logprob) : json(nullptr)}, {"bytes", byte_list(token_bytes(token))}};
    json top = json::array();
    if (lp != nullptr)
      for (const TopLogprob& t : lp->top)
        top.push_back({{"token", token_text(t.token)}, {"logprob", logprob_value(t.logprob)},
                       {"bytes", byte_list(token_bytes(t.token))}});
    entry["top_logprobs"] = std::move(top);
    target.push_back(std::move(entry));
    return;
  }
  target["tokens"].push_back(text);
  target["text_offset"].push_back(c.text_offset);
  c.text_offset += text.size();
  if (lp == nullptr) {
    target["token_logprobs"].push_back(nullptr);
    target["top_logprobs"].push_back(nullptr);
    return;
  }
  target["token_logprobs"].push_back(logprob_value(lp->logprob));
  json top = json::object();
  for (const TopLogprob& t : lp->top) top[token_text(t.token)] = logprob_value(t.logprob);
  top[text] = logprob_value(lp->logprob);  // the sampled token is always listed (vLLM)
  target["top_logprobs"].push_back(std::move(top));
}

json GenerationState::chunk_base() const {
  return json{{"id", setup_.id},
              {"object", setup_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
              {"created", setup_.created},
              {"model", setup_.model}};
}

json GenerationState::usage() const {
  int prompt = 0, completion = 0, cached = 0;
  for (size_t p = 0; p < setup_.prompts.size(); ++p) {
    prompt += static_cast<int>(setup_.prompts[p].size());
    cached += choices_[p * setup_.n].n_cached;  // a prompt counts once, as its first choice saw it
  }
  for (const Choice& c : choices_) completion += c.n_tokens;
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json GenerationState::stop_reason(const Choice& c) const {
  if (c.stop_string) return *c.stop_string;
  if (c.stop_token) return *c.stop_token;
  return nullptr;
}

std::string GenerationState::finish_reason(const Choice& c) const {
  const bool normal = c.reason == FinishReason::kStop || c.reason == FinishReason::kLength;
  return normal && !c.tool_calls.empty() ? "tool_calls" : finish_reason_name(c.reason);
}

json GenerationState::tool_call_json(size_t choice, size_t index, const ParsedToolCall& call) const {
  char id[40];
  const uint64_t bits = mix64(setup_.id_bits ^ mix64((static_cast<uint64_t>(choice) << 32) | index));
  std::snprintf(id, sizeof id, "call_%016llx%08x", static_cast<unsigned long long>(bits),
                static_cast<unsigned>(mix64(bits) >> 32));
  return json{{"id", id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments()}}}};
}

// Feeds a chat choice's new text through its parser; returns the stream's deltas for it
// (reasoning, content, then each new call: its id and name, then its argument fragments) and
// keeps the totals for the final message.
std::vector<json> GenerationState::chat_deltas(size_t choice, Choice& c, const std::string& text, bool finished) {
  ChatDelta d = c.parser->push(text);
  if (finished) {
    ChatDelta rest = c.parser->finish();
    d.reasoning += rest.reasoning;
    d.content += rest.content;
    for (ParsedToolCall& call : rest.calls) d.calls.push_back(std::move(call));
  }
  std::vector<json> deltas;
  if (!d.reasoning.empty()) deltas.push_back({{"reasoning_content", d.reasoning}});
  if (!d.content.empty()) deltas.push_back({{"content", d.content}});
  c.reasoning += d.reasoning;
  c.text += d.content;
  for (const ParsedToolCall& call : d.calls) {
    const size_t index = c.tool_calls.size();
    json full = tool_call_json(choice, index, call);
    json head = full;
    head["function"]["arguments"] = "";
    head["index"] = index;
    deltas.push_back({{"tool_calls", json::array({head})}});
    for (const std::string& fragment : call.argument_fragments)
      deltas.push_back({{"tool_calls", json::array({{{"index", index}, {"function", {{"arguments", fragment}}}}})}});
    c.tool_calls.push_back(std::move(full));
  }
  return deltas;
}

void GenerationState::write_chunk(const json& chunk) { exchange_->stream("data: " + dump_json(chunk) + "\n\n"); }

void GenerationState::handle(SeqOutput& o) {
  const size_t index = static_cast<size_t>(o.index);
  MD_CHECK(index < choices_.size(), "event for choice ", index, " of ", choices_.size());
  Choice& c = choices_[index];
  if (c.finished) return;
  const size_t prompt_index = index / setup_.n;
  c.n_tokens = o.n_completion_tokens;
  c.n_cached = o.n_cached_tokens;

  // This event's share: text, and logprobs (with the echoed prompt on a choice's first event).
  std::string text;
  json lps = new_logprobs();
  if (!c.started && setup_.echo) {
    text = setup_.echo_text[prompt_index];
    if (setup_.logprobs) {
      const auto& prompt = setup_.prompts[prompt_index];
      for (size_t k = 0; k < prompt.size(); ++k) {
        const TokenLogprob* lp = nullptr;
        if (o.prompt_logprobs && k < o.prompt_logprobs->size() && (*o.prompt_logprobs)[k]) lp = &*(*o.prompt_logprobs)[k];
        add_logprob(c, lps, prompt[k], lp);
      }
    }
  }
  const bool first_event = !c.started;
  c.started = true;
  text += o.text;
  if (setup_.logprobs)
    for (size_t k = 0; k < o.tokens.size() && k < o.logprobs.size(); ++k) add_logprob(c, lps, o.tokens[k], &o.logprobs[k]);
  if (o.finished) {
    c.finished = true;
    ++n_finished_;
    c.reason = o.finish_reason;
    c.stop_string = o.stop_string;
    c.stop_token = o.stop_token;
    c.error = o.error;
  }
  const bool has_lps = setup_.endpoint == Endpoint::kChat ? !lps.empty() : !lps["tokens"].empty();

  if (!setup_.stream) {
    if (c.parser) {
      chat_deltas(index, c, text, o.finished);
    } else {
      c.text += text;
    }
    if (setup_.token_ids) c.token_ids.insert(c.token_ids.end(), o.tokens.begin(), o.tokens.end());
    if (has_lps) {
      if (setup_.endpoint == Endpoint::kChat) {
        for (auto& e : lps) c.logprobs.push_back(std::move(e));
      } else {
        for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
          for (auto& e : lps[k]) c.logprobs[k].push_back(std::move(e));
      }
    }
    if (n_finished_ == static_cast<int>(choices_.size())) finish_response();
    return;
  }

  const bool ended_normally = o.finished && (o.finish_reason == FinishReason::kStop || o.finish_reason == FinishReason::kLength);
  // The event's chunks: one per delta (chat) or one with the text (completions); logprobs ride on
  // the first, the finish reason on the last; an event with neither text nor deltas still
  // sends one chunk when it carries logprobs or the end.
  std::vector<json> deltas;
  if (setup_.endpoint == Endpoint::kChat) {
    if (c.parser) {
      deltas = chat_deltas(index, c, text, o.finished);
    } else if (!text.empty()) {
      deltas.push_back({{"content", text}});
    }
  } else if (!text.empty() || (setup_.token_ids && !o.tokens.empty())) {
    deltas.push_back(json::object());
  }
  if (deltas.empty() && (has_lps || ended_normally || (first_event && setup_.echo))) deltas.push_back(json::object());
  for (size_t k = 0; k < deltas.size(); ++k) {
    const bool first = k == 0, last = k + 1 == deltas.size();
    json choice;
    choice["index"] = index;
    if (setup_.endpoint == Endpoint::kChat) {
      choice["delta"] = std::move(deltas[k]);
      choice["logprobs"] = first && has_lps ? json{{"content", lps}} : json(nullptr);
    } else {
      choice["text"] = text;
      if (setup_.token_ids) choice["token_ids"] = o.tokens;
      choice["logprobs"] = has_lps ? lps : json(nullptr);
    }
    choice["finish_reason"] = last && ended_normally ? json(finish_reason(c)) : json(nullptr);
    choice["stop_reason"] = last && ended_normally ? stop_reason(c) : json(nullptr);
    json chunk = chunk_base();
    chunk["choices"] = json::array({std::move(choice)});
    if (setup_.continuous_usage_stats) chunk["usage"] = usage();
    write_chunk(chunk);
  }
  if (n_finished_ == static_cast<int>(choices_.size())) finish_stream();
}

void GenerationState::finish_stream() {
  // An error or a shutdown mid-stream: one error event (vLLM's shape), then the usual ending.
  for (const Choice& c : choices_) {
    if (c.reason == FinishReason::kError || c.reason == FinishReason::kAbort) {
      ApiError e = c.reason == FinishReason::kError ? server_error("generation failed: " + c.error)
                                                    : ApiError(503, "the request was aborted (server shutting down)", "server_error");
      exchange_->stream("data: " + e.body() + "\n\n");
      break;
    }
  }
  if (setup_.include_usage) {
    json chunk = chunk_base();
    chunk["choices"] = json::array();
    chunk["usage"] = usage();
    write_chunk(chunk);
  }
  exchange_->stream("data: [DONE]\n\n");
  exchange_->end_stream();
}

void GenerationState::finish_response() {
  for (const Choice& c : choices_) {
    if (c.reason == FinishReason::kError) {
      ApiError e = server_error("generation failed: " + c.error);
      exchange_->respond(e.status, "application/json", e.body());
      return;
    }
    if (c.reason == FinishReason::kAbort) {
      ApiError e(503, "the request was aborted (server shutting down)", "server_error");
      exchange_->respond(e.status, "application/json", e.body());
      return;
    }
  }
  json out = {{"id", setup_.id},
              {"object", setup_.endpoint == Endpoint::kChat ? "chat.completion" : "text_completion"},
              {"created", setup_.created},
              {"model", setup_.model}};
  json list = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    json choice = {{"index", i}};
    const bool has_lps = setup_.logprobs.has_value();
    if (setup_.endpoint == Endpoint::kChat) {
      json message = {{"role", "assistant"}};
      // No text beside a tool call or reasoning is null, as OpenAI and vLLM send it.
      const bool null_content = c.text.empty() && (!c.tool_calls.empty() || !c.reasoning.empty());
      message["content"] = null_content ? json(nullptr) : json(c.text);
      if (setup_.chat_output.reasoning)
        message["reasoning_content"] = c.reasoning.empty() ? json(nullptr) : json(c.reasoning);
      if (!c.tool_calls.empty()) message["tool_calls"] = c.tool_calls;
      choice["message"] = std::move(message);
      choice["logprobs"] = has_lps ? json{{"content", c.logprobs}} : json(nullptr);
    } else {
      choice["text"] = c.text;
      if (setup_.token_ids) choice["token_ids"] = c.token_ids;
      choice["logprobs"] = has_lps ? c.logprobs : json(nullptr);
    }
    choice["finish_reason"] = finish_reason(c);
    choice["stop_reason"] = stop_reason(c);
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = usage();
  exchange_->respond(200, "application/json", dump_json(out));
}

}  // namespace megadecode
