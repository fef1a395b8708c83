// Random conversations for the chat template tests: system/user/assistant/tool messages, reasoning
// (in <think> tags and as reasoning_content), tool calls with nested JSON arguments, tool lists
// with the JSON-schema keys real clients send, the /think and /no_think switches, and every
// template flag (enable_thinking, and cmd4's reasoning and reasoning_effort). Also the OpenAI-shaped JSON of a conversation, as the JavaScript reference and
// the server read it.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/sample_text.h"

namespace megadecode::testing {

using OJson = nlohmann::ordered_json;

class ChatSampler {
 public:
  explicit ChatSampler(uint64_t seed) : rng_(seed) {}

  ChatInput conversation() {
    ChatInput in;
    if (chance(3, 5)) in.messages.push_back({"system", text(), {}, {}, {}});
    const int n_tools = chance(1, 2) ? static_cast<int>(below(5)) + 1 : 0;
    for (int i = 0; i < n_tools; ++i) in.tools.push_back(tool(i));
    const int n_turns = 1 + static_cast<int>(below(5));
    for (int t = 0; t < n_turns; ++t) turn(in, n_tools > 0);
    if (chance(1, 6)) shuffle_roles(in.messages);
    const uint64_t thinking = below(3);
    if (thinking > 0) in.enable_thinking = thinking == 1;
    static const char* kEfforts[] = {"none", "None", "NONE", "high", "low", ""};
    if (chance(1, 3)) in.reasoning = chance(1, 2);
    if (chance(1, 3)) in.reasoning_effort = kEfforts[below(std::size(kEfforts))];
    in.add_generation_prompt = chance(1, 2);
    in.continue_final_message = !in.add_generation_prompt && chance(1, 6);
    return in;
  }

  // A short piece of text, now and then with Unicode, think tags, the soft switches or edges of
  // whitespace that Python and JavaScript strip differently.
  std::string text() {
    static const char* kEdges[] = {"", " ", "\n", "\n\n", "\t", "\xE3\x80\x80", "\xC2\x85", "\xEF\xBB\xBF", "\x1F"};
    std::string s;
    switch (below(12)) {
      case 0: s = sample_text::generate(static_cast<sample_text::Kind>(below(sample_text::kNumKinds)), rng_); break;
      case 1: s = "Explain it. /no_think"; break;
      case 2: s = "/think Please think hard about " + word(); break;
      case 3: s = "<tool_response>\n" + word() + "\n</tool_response>"; break;
      default: s = sentence();
    }
    if (chance(1, 5)) s = kEdges[below(std::size(kEdges))] + s + kEdges[below(std::size(kEdges))];
    return s;
  }

 private:
  uint64_t below(uint64_t n) { return rng_.below(n); }
  bool chance(uint64_t num, uint64_t den) { return below(den) < num; }

  std::string word() {
    static const char* kWords[] = {"alpha", "beta", "file", "path", "query", "unit", "x", "Zürich", "数据", "naïve",
                                   "count", "name", "value", "🙂", "main.cpp", "a\"b", "it's", "back\\slash"};
    return kWords[below(std::size(kWords))];
  }
  std::string sentence() {
    std::string s;
    const int n = 1 + static_cast<int>(below(8));
    for (int i = 0; i < n; ++i) s += (i ? " " : "") + word();
    return s;
  }
  std::string ident() {
    static const char* kIdents[] = {"path", "content", "limit", "offset", "query", "mode", "recursive", "items",
                                    "options", "file_path", "timeout", "command", "pattern", "n"};
    return kIdents[below(std::size(kIdents))];
  }

  // JSON values for arguments and schema extras. Floats are non-integral and in [1e-4, 1e16),
  // where Python's and JavaScript's number printing agree.
  OJson value(int depth) {
    switch (below(depth > 2 ? 6 : 8)) {
      case 0: return nullptr;
      case 1: return chance(1, 2);
      case 2: return static_cast<int64_t>(below(2000)) - 1000;
      case 3: return (static_cast<double>(below(100000)) + 0.5) / 64.0;
      case 4: return text();
      case 5: return static_cast<int64_t>(below(1ull << 40));
      case 6: {
        OJson a = OJson::array();
        for (uint64_t i = below(4); i > 0; --i) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        OJson o = OJson::object();
        for (uint64_t i = below(4); i > 0; --i) o[ident()] = value(depth + 1);
        return o;
      }
    }
  }

  OJson property() {
    static const char* kTypes[] = {"string", "integer", "number", "boolean", "array", "object"};
    OJson p = OJson::object();
    if (chance(1, 8)) p["description"] = text();  // key order varies: the template walks the given order
    if (!chance(1, 10)) {
      if (chance(1, 5)) {
        p["type"] = OJson::array({kTypes[below(6)], "null"});
      } else {
        p["type"] = kTypes[below(6)];
      }
    }
    if (!p.contains("description") && chance(2, 3)) p["description"] = text();
    if (chance(1, 4)) p["enum"] = OJson::array({word(), word()});
    if (chance(1, 4)) p["default"] = value(3);
    if (chance(1, 5)) p["minimum"] = static_cast<int64_t>(below(10));
    if (chance(1, 6)) p["additionalProperties"] = chance(1, 2);
    if (chance(1, 6)) p["items"] = OJson{{"type", "string"}};
    if (chance(1, 8)) p["nullable"] = nullptr;
    return p;
  }

  OJson tool(int index) {
    OJson f = OJson::object();
    f["name"] = "tool_" + ident() + "_" + std::to_string(index);
    if (chance(4, 5)) f["description"] = text();
    if (chance(5, 6)) {
      OJson params = OJson::object();
      if (chance(4, 5)) params["type"] = "object";
      OJson props = OJson::object();
      for (uint64_t i = below(5); i > 0; --i) props[ident()] = property();
      params["properties"] = props;
      if (chance(1, 2)) params["required"] = OJson::array({ident()});
      if (chance(1, 4)) params["additionalProperties"] = false;
      f["parameters"] = params;
    }
    if (chance(1, 6)) f["strict"] = chance(1, 2);
    return OJson{{"type", "function"}, {"function", f}};
  }

  ChatToolCall call(int k) {
    ChatToolCall c;
    c.id = "call_" + std::to_string(k);
    c.name = "tool_" + ident();
    for (uint64_t i = below(4); i > 0; --i) c.arguments[ident()] = value(1);
    return c;
  }

  std::string assistant_content() {
    switch (below(7)) {
      case 0: return "";
      case 1: return "<think>\n" + text() + "\n</think>\n\n" + text();
      case 2: return "\n<think>\n\n" + text() + "\n\n</think>" + text() + "\n";
      case 3: return text() + "</think>\n" + text() + "</think>\n\n" + text();
      default: return text();
    }
  }

  void turn(ChatInput& in, bool tools) {
    in.messages.push_back({"user", text(), {}, {}, {}});
    for (int step = 0; step < 3; ++step) {
      ChatMessage a{"assistant", assistant_content(), {}, {}, {}};
      if (chance(1, 4)) a.reasoning_content = chance(1, 4) ? std::string() : text();
      const int n_calls = tools && chance(2, 3) ? 1 + static_cast<int>(below(3)) : 0;
      for (int k = 0; k < n_calls; ++k) a.tool_calls.push_back(call(k));
      in.messages.push_back(a);
      if (n_calls == 0) return;
      for (int k = 0; k < n_calls; ++k) in.messages.push_back({"tool", text(), {}, {}, "call_" + std::to_string(k)});
      if (chance(1, 3)) return;  // a conversation may end on tool results
    }
  }

  // Now and then a less regular history: a tool message first, a late system message, ...
  void shuffle_roles(std::vector<ChatMessage>& messages) {
    static const char* kRoles[] = {"system", "user", "assistant", "tool"};
    for (ChatMessage& m : messages) {
      if (!chance(1, 4)) continue;
      m.role = kRoles[below(4)];
      if (m.role != "assistant") {
        m.tool_calls.clear();
        m.reasoning_content.reset();
      }
    }
  }

  SplitMix64 rng_;
};

// cmd4's other variables on a sampled conversation (its own random stream, so the other
// families' conversations stay as they were): documents (text, "data" objects, other objects),
// grounding in any case, a platform instruction override, response_format (json_object, and
// string schemas: {{ json_schema }} of an object prints Python's repr), regen_tool_call_ids
// false, and contents as parts: text and image parts in turns, a leading thinking part of an
// assistant, and tool results as lists of text, document and other parts, or an object.
class Cmd4Features {
 public:
  explicit Cmd4Features(uint64_t seed) : rng_(seed), text_(seed ^ 0x5bd1e995ull) {}

  void add(ChatInput& in) {
    if (chance(1, 3)) {
      for (uint64_t n = 1 + below(3); n > 0; --n) in.documents.push_back(document());
    }
    static const char* kGrounding[] = {"enabled", "ENABLED", "Enabled", "disabled", "off", ""};
    if (chance(1, 2)) in.grounding = kGrounding[below(std::size(kGrounding))];
    if (chance(1, 5)) in.platform_instruction_override = chance(1, 4) ? std::string() : text_.text();
    switch (below(8)) {
      case 0: in.response_format = {{"type", "json_object"}}; break;
      case 1: in.response_format = {{"type", "json_schema"}, {"json_schema", schema()}}; break;
      case 2: in.response_format = {{"type", "json_object"}, {"schema", schema()}}; break;
      case 3: in.response_format = {{"type", "text"}}; break;
      default: break;
    }
    if (chance(1, 8)) in.regen_tool_call_ids = false;
    for (ChatMessage& m : in.messages) {
      if (!chance(1, 3)) continue;
      m.parts = m.role == "tool" ? tool_parts(m.content) : turn_parts(m);
    }
  }

 private:
  uint64_t below(uint64_t n) { return rng_.below(n); }
  bool chance(uint64_t num, uint64_t den) { return below(den) < num; }

  OJson document() {
    switch (below(4)) {
      case 0: return {{"content", text_.text()}};
      case 1: return {{"data", {{"title", text_.text()}, {"snippet", text_.text()}}}};
      case 2: return {{"data", ""}, {"url", text_.text()}};  // falsy data: the document itself
      default: return {{"id", "doc_" + std::to_string(below(100))}, {"text", text_.text()}, {"n", below(5)}};
    }
  }
  std::string schema() {
    return chance(1, 4) ? std::string() : "{\n  \"type\": \"object\", \"properties\": {\"" + text_.text() + "\": {}}\n}";
  }

  // The message's text split into text parts, now and then with image parts and, for an
  // assistant, a leading thinking part; `content` keeps the text.
  OJson turn_parts(ChatMessage& m) {
    OJson parts = OJson::array();
    if (m.role == "assistant" && chance(1, 3))
      parts.push_back({{"type", "thinking"}, {"thinking", chance(1, 4) ? std::string() : text_.text()}});
    const std::string& text = m.content;
    size_t at = 0;
    while (at < text.size() || parts.empty()) {
      if (chance(1, 5)) parts.push_back(chance(1, 2) ? OJson{{"type", "image"}} : OJson{{"type", "image"}, {"data", "<|IMG_PATCH|>"}});
      size_t n = text.size() - at;
      if (n > 4 && chance(1, 2)) n = 1 + below(n - 1);
      while (at + n < text.size() && (static_cast<unsigned char>(text[at + n]) & 0xC0) == 0x80) ++n;  // whole characters
      parts.push_back({{"type", chance(1, 6) ? "Text" : "text"}, {"text", text.substr(at, n)}});
      at += n;
    }
    if (chance(1, 5)) parts.push_back({{"type", "image"}});
    return parts;
  }

  OJson tool_parts(const std::string& content) {
    if (chance(1, 5)) return {{"result", content}, {"ok", chance(1, 2)}};
    OJson parts = OJson::array();
    for (uint64_t n = below(4); n > 0; --n) {
      switch (below(4)) {
        case 0: parts.push_back({{"type", "document"}, {"document", {{"data", {{"value", text_.text()}}}}}}); break;
        case 1: parts.push_back({{"type", "document"}, {"document", {{"title", text_.text()}}}}); break;
        case 2: parts.push_back({{"type", "image_url"}, {"image_url", {{"url", "data:,"}}}}); break;
        default: parts.push_back({{"type", "text"}, {"text", text_.text()}}); break;
      }
    }
    parts.push_back({{"type", "text"}, {"text", content}});
    return parts;
  }

  SplitMix64 rng_;
  ChatSampler text_;
};

// The OpenAI-shaped JSON of one message (tool-call arguments as objects, as vLLM passes them).
// A content given as parts is sent as those parts.
inline OJson message_json(const ChatMessage& m) {
  OJson j = {{"role", m.role}, {"content", m.parts.is_null() ? OJson(m.content) : m.parts}};
  if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
  if (!m.tool_calls.empty()) {
    OJson calls = OJson::array();
    for (const ChatToolCall& c : m.tool_calls)
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    j["tool_calls"] = calls;
  }
  if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
  return j;
}

}  // namespace megadecode::testing
