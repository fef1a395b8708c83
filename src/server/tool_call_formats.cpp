// Parsing one generated tool call per format (see tool_call_formats.h).
#include "server/tool_call_formats.h"

#include "tokenizer/template_values.h"

namespace megadecode {
namespace {

namespace tv = template_values;
using Json = nlohmann::ordered_json;

constexpr ToolCallTags kToolCallTags{"<tool_call>", "</tool_call>"};
constexpr ToolCallTags kFunctionTags{"<function=", "</function>"};
constexpr ToolCallTags kActionTags{"<|START_ACTION|>", "<|END_ACTION|>"};

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim_blank(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

bool consume(std::string_view& s, std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  return true;
}

// "{" first member, ", " next member, ..., "}": the arguments in pieces that join to to_json().
ParsedToolCall make_call(std::string name, const Json& arguments) {
  ParsedToolCall call{std::move(name), {}};
  if (arguments.empty()) {
    call.argument_fragments.push_back("{}");
    return call;
  }
  bool first = true;
  for (const auto& [key, value] : arguments.items()) {
    call.argument_fragments.push_back((first ? "{" : ", ") + tv::to_json(key) + ": " + tv::to_json(value));
    first = false;
  }
  call.argument_fragments.back() += "}";
  return call;
}

std::optional<ParsedToolCall> parse_hermes(std::string_view body) {
  const Json j = Json::parse(trim_blank(body), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  Json arguments = Json::object();
  if (auto a = j.find("arguments"); a != j.end() && !a->is_null()) {
    arguments = *a;
    if (arguments.is_string()) arguments = Json::parse(a->get<std::string>(), nullptr, false);  // JSON in a string
    if (arguments.is_discarded() || !arguments.is_object()) return std::nullopt;
  }
  return make_call(name->get<std::string>(), arguments);
}

// The JSON-schema type the tool declares for a parameter ("" when unknown); the first non-null
// type of a list, and whether null is allowed.
std::string declared_type(const Json& tools, std::string_view function, const std::string& param, bool* nullable) {
  *nullable = false;
  for (const Json& tool : tools) {
    const Json& f = tool.contains("function") ? tool["function"] : tool;
    if (!f.is_object() || f.value("name", "") != function) continue;
    const Json* props = f.contains("parameters") && f["parameters"].is_object() && f["parameters"].contains("properties")
                            ? &f["parameters"]["properties"]
                            : nullptr;
    if (props == nullptr || !props->is_object() || !props->contains(param) || !(*props)[param].is_object()) return "";
    const Json& type = (*props)[param].value("type", Json());
    if (type.is_string()) return type.get<std::string>();
    std::string first;
    if (type.is_array())
      for (const Json& t : type) {
        if (t == "null") *nullable = true;
        if (t.is_string() && t != "null" && first.empty()) first = t.get<std::string>();
      }
    return first;
  }
  return "";
}

// A parameter's text typed by its schema; the text itself when it does not read as that type.
// A number's text is its JSON number whatever the declared kind (an integer too long for 64 bits
// parses as a float, still integral; a schema's ["integer", "number"] declares "integer").
Json typed_value(const std::string& text, const std::string& type, bool nullable) {
  if ((nullable || type == "null") && (text == "null" || text == "None")) return nullptr;
  if (type == "integer" || type == "number") {
    const Json v = Json::parse(text, nullptr, false);
    if (!v.is_discarded() && v.is_number()) return v;
  } else if (type == "boolean") {
    if (text == "true" || text == "True") return true;
    if (text == "false" || text == "False") return false;
  } else if (type == "object" || type == "array") {
    const Json v = Json::parse(text, nullptr, false);
    if (!v.is_discarded() && (type == "object" ? v.is_object() : v.is_array())) return v;
  }
  return text;
}

// body: "NAME>\n<parameter=P>\nvalue\n</parameter>\n..." (after "<function="), with or without
// the closing </function>.
std::optional<ParsedToolCall> parse_function(std::string_view body, const Json& tools) {
  const size_t name_end = body.find('>');
  if (name_end == std::string_view::npos) return std::nullopt;
  const std::string name(trim_blank(body.substr(0, name_end)));
  if (name.empty() || name.find_first_of("<\n") != std::string::npos) return std::nullopt;
  std::string_view rest = body.substr(name_end + 1);
  if (const size_t end = rest.rfind("</function>"); end != std::string_view::npos) {
    if (!trim_blank(rest.substr(end + 11)).empty()) return std::nullopt;
    rest = rest.substr(0, end);
  }
  Json arguments = Json::object();
  for (;;) {
    rest = trim_blank(rest);
    if (rest.empty()) break;
    if (!consume(rest, "<parameter=")) return std::nullopt;
    const size_t pname_end = rest.find('>');
    if (pname_end == std::string_view::npos) return std::nullopt;
    const std::string param(trim_blank(rest.substr(0, pname_end)));
    if (param.empty() || param.find_first_of("<\n") != std::string::npos) return std::nullopt;
    rest.remove_prefix(pname_end + 1);
    const size_t value_end = rest.find("</parameter>");
    if (value_end == std::string_view::npos) return std::nullopt;
    std::string_view value = rest.substr(0, value_end);
    rest.remove_prefix(value_end + 12);
    // The template writes "\n" around every value; the value is what lies between.
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    bool nullable = false;
    const std::string type = declared_type(tools, name, param, &nullable);
    arguments[param] = typed_value(std::string(value), type, nullable);
  }
  return make_call(name, arguments);
}

// body: a JSON list of {"tool_call_id", "tool_name", "parameters"} (cmd4's action block). Every
// element must be a call with a non-empty name and object parameters (absent or null: {}; a
// string holding a JSON object is read as that object); an empty list is no action.
std::optional<std::vector<ParsedToolCall>> parse_actions(std::string_view body) {
  const Json j = Json::parse(trim_blank(body), nullptr, false);
  if (j.is_discarded() || !j.is_array() || j.empty()) return std::nullopt;
  std::vector<ParsedToolCall> calls;
  for (const Json& action : j) {
    if (!action.is_object()) return std::nullopt;
    auto name = action.find("tool_name");
    if (name == action.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
    Json parameters = Json::object();
    if (auto p = action.find("parameters"); p != action.end() && !p->is_null()) {
      parameters = p->is_string() ? Json::parse(p->get<std::string>(), nullptr, false) : *p;
      if (parameters.is_discarded() || !parameters.is_object()) return std::nullopt;
    }
    calls.push_back(make_call(name->get<std::string>(), parameters));
  }
  return calls;
}

}  // namespace

std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "qwen3_coder" || name == "qwen3_xml") return ToolCallFormat::kQwen3Coder;
  if (name == "cohere_command4") return ToolCallFormat::kCohereCommand4;
  return std::nullopt;
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kQwen3Coder: return "qwen3_coder";
    case ToolCallFormat::kCohereCommand4: return "cohere_command4";
  }
  return "";
}

std::string ParsedToolCall::arguments() const {
  std::string out;
  for (const std::string& f : argument_fragments) out += f;
  return out;
}

std::vector<ToolCallTags> tool_call_tags(ToolCallFormat format) {
  if (format == ToolCallFormat::kHermes) return {kToolCallTags};
  if (format == ToolCallFormat::kCohereCommand4) return {kActionTags};
  return {kToolCallTags, kFunctionTags};
}

std::optional<std::vector<ParsedToolCall>> parse_tool_calls(ToolCallFormat format, const ToolCallTags& tags,
                                                            std::string_view body, const Json& tools) {
  if (format == ToolCallFormat::kCohereCommand4) return parse_actions(body);
  std::optional<ParsedToolCall> call;
  std::string_view inner = trim_blank(body);
  if (format == ToolCallFormat::kHermes) {
    call = parse_hermes(body);
  } else if (tags.open == kFunctionTags.open) {
    call = parse_function(std::string(body) + "</function>", tools);
  } else if (consume(inner, "<function=")) {
    call = parse_function(inner, tools);
  }
  if (!call) return std::nullopt;
  return std::vector<ParsedToolCall>{std::move(*call)};
}

std::string tool_call_opening(ToolCallFormat format, std::string_view name) {
  if (format == ToolCallFormat::kCohereCommand4) {  // the first call of the list, as the template writes it
    const std::string head = "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": ";
    if (name.empty()) return head + "\"";
    return head + tv::to_json(std::string(name)) + ", \"parameters\": ";
  }
  if (format == ToolCallFormat::kHermes) {
    if (name.empty()) return "<tool_call>\n{\"name\": \"";
    return "<tool_call>\n{\"name\": " + tv::to_json(std::string(name)) + ", \"arguments\": ";
  }
  if (name.empty()) return "<tool_call>\n<function=";
  return "<tool_call>\n<function=" + std::string(name) + ">\n";
}

}  // namespace megadecode
