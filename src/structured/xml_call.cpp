// Qwen3-Coder's tool call as grammar (see xml_call.h).
#include "structured/xml_call.h"

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <vector>

namespace megadecode::structured {
namespace {

// What a text parameter may never contain: its own end, and the end of the call (either would end
// the server's parse early).
const std::array<std::string, 2> kForbidden = {"</parameter>", "</tool_call>"};

bool has_forbidden(const std::string& s) {
  return std::any_of(kForbidden.begin(), kForbidden.end(), [&](const std::string& f) { return s.find(f) != s.npos; });
}

// Raw text and the "\n</parameter>" after it, as one rule: valid UTF-8 without control bytes but
// \t \n \r, and none of kForbidden. The states are the prefixes of the forbidden strings read so
// far (an Aho-Corasick automaton whose failure links all lead to "" or "<": '<' opens every
// forbidden string and appears in none elsewhere); a multi-byte character leads back to "". Every
// state may end the text, and the rule ends only after the closing tag: a rule that could return
// anywhere would have the matcher walk every trie node against its caller at each mask.
NodeId raw_text_rule(GrammarBuilder& b) {
  for (const std::string& f : kForbidden) MD_CHECK(f[0] == '<' && f.find('<', 1) == std::string::npos);
  std::map<std::string, NodeId> state;  // prefix -> node
  state[""] = b.node();
  for (const std::string& f : kForbidden)
    for (size_t k = 1; k < f.size(); ++k) state.try_emplace(f.substr(0, k), -1);
  for (auto& [prefix, node] : state)
    if (node < 0) node = b.node();
  const NodeId root = state[""];
  const NodeId rule = b.rule();
  const Frag close = b.literal("\n</parameter>");
  // Continuation bytes of a multi-byte character, back to "" (shared by every state).
  const NodeId c1 = b.node(), c2 = b.node(), c3 = b.node(), e0 = b.node(), ed = b.node(), f0 = b.node(),
               f4 = b.node();
  b.edge(c1, 0x80, 0xBF, root);
  b.edge(c2, 0x80, 0xBF, c1);
  b.edge(c3, 0x80, 0xBF, c2);
  b.edge(e0, 0xA0, 0xBF, c1);
  b.edge(ed, 0x80, 0x9F, c1);
  b.edge(f0, 0x90, 0xBF, c2);
  b.edge(f4, 0x80, 0x8F, c2);
  auto ascii_ok = [](int c) { return c == '\t' || c == '\n' || c == '\r' || (c >= 0x20 && c <= 0x7E); };
  for (const auto& [prefix, from] : state) {
    // ASCII: the byte's next state, as runs of bytes with one target.
    int run_lo = -1;
    NodeId run_to = -1;
    for (int c = 0; c <= 0x80; ++c) {
      NodeId to = -1;
      if (c < 0x80 && ascii_ok(c)) {
        const std::string next = prefix + static_cast<char>(c);
        if (std::find(kForbidden.begin(), kForbidden.end(), next) != kForbidden.end()) to = -1;
        else if (const auto it = state.find(next); it != state.end()) to = it->second;
        else to = c == '<' ? state["<"] : root;
      }
      if (to != run_to || to < 0) {
        if (run_to >= 0) b.edge(from, static_cast<uint8_t>(run_lo), static_cast<uint8_t>(c - 1), run_to);
        run_lo = c;
        run_to = to;
      }
    }
    b.edge(from, 0xC2, 0xDF, c1);
    b.edge(from, 0xE0, 0xE0, e0);
    b.edge(from, 0xE1, 0xEC, c2);
    b.edge(from, 0xED, 0xED, ed);
    b.edge(from, 0xEE, 0xEF, c2);
    b.edge(from, 0xF0, 0xF0, f0);
    b.edge(from, 0xF1, 0xF3, c3);
    b.edge(from, 0xF4, 0xF4, f4);
    b.eps(from, close.begin);
  }
  b.define(rule, {root, close.end});
  return rule;
}

const char* kTyped = "a Qwen3-Coder parameter is typed by its own \"type\" (the parser reads the text of any other "
                     "as a string)";

class XmlCall {
 public:
  XmlCall(SchemaCompiler& c, GrammarBuilder& b) : c_(c), b_(b) {}

  Frag call(const Json& tool, const std::string& ptr) {
    if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string() || !tool.contains("parameters"))
      throw SchemaError("", ptr, "a tool is {\"name\", \"parameters\"}");
    const std::string name = tool["name"].get<std::string>();
    if (!readable_name(name))
      throw SchemaError("name", ptr + "/name", cat("the tool name \"", name, "\" cannot be written in a <function=...> tag"));
    const Json& params = tool["parameters"];
    const std::string pptr = ptr + "/parameters";
    if (!params.is_object()) throw SchemaError("parameters", pptr, "a Qwen3-Coder call needs an object schema of properties");
    for (const char* k : {"$ref", "anyOf", "oneOf"})
      if (params.contains(k)) fail(k, pptr, "a Qwen3-Coder call lists its parameters by name: one object schema of properties");
    if (params.contains("type") && params["type"] != "object") fail("type", pptr, "a Qwen3-Coder call's parameters are an object");
    c_.check(params, pptr);  // every keyword checked as the JSON path would
    static const Json kEmpty = Json::object();
    const Json& props = params.contains("properties") ? params["properties"] : kEmpty;
    std::vector<std::string> required;
    if (params.contains("required"))
      for (const Json& r : params["required"]) required.push_back(r.get<std::string>());
    NodeId at = b_.node();
    const Frag head = b_.seq({b_.literal("<function=" + name + ">\n"), Frag{at, at}});
    for (const auto& [key, sub] : props.items()) {
      const std::string kptr = pptr + "/properties/" + escape_pointer_token(key);
      if (!readable_name(key))
        throw SchemaError("properties", kptr, cat("the parameter name \"", key, "\" cannot be written in a <parameter=...> tag"));
      const Frag block = b_.seq({b_.literal("<parameter=" + key + ">\n"), value(sub, kptr)});
      const NodeId next = b_.node();
      b_.eps(b_.seq({Frag{at, at}, block}).end, next);
      if (std::find(required.begin(), required.end(), key) == required.end()) b_.eps(at, next);
      at = next;
    }
    return {head.begin, b_.seq({Frag{at, at}, b_.literal("</function>\n")}).end};
  }

 private:
  [[noreturn]] static void fail(const std::string& keyword, const std::string& ptr, const std::string& why) {
    throw SchemaError(keyword, ptr + "/" + escape_pointer_token(keyword), why);
  }
  // The parser trims a name's blanks and refuses '<' and line breaks; '>' ends the tag.
  static bool readable_name(const std::string& s) {
    return !s.empty() && s.find_first_of("<>\n\r") == std::string::npos && s.front() != ' ' && s.back() != ' ' &&
           s.front() != '\t' && s.back() != '\t';
  }

  // A value and its closing tag: raw text (its rule holds the tag), or `v` then the tag.
  Frag raw_text() {
    if (raw_rule_ < 0) raw_rule_ = raw_text_rule(b_);
    return b_.seq({b_.call(raw_rule_), b_.literal("\n")});
  }
  Frag closed(Frag v) { return b_.seq({v, b_.literal("\n</parameter>\n")}); }

  // The enum/const values of s that are strings (and null where the text "null" reads as null).
  Frag text_values(const Json& s, const std::string& ptr, bool nullable) {
    std::vector<Json> values;
    if (s.contains("const")) values = {s["const"]};
    else for (const Json& v : s["enum"]) values.push_back(v);
    std::vector<Frag> options;
    for (const Json& v : values) {
      std::string text;
      if (v.is_string()) text = v.get<std::string>();
      else if (v.is_null() && nullable) text = "null";
      else continue;
      if (has_forbidden(text))
        fail(s.contains("const") ? "const" : "enum", ptr, cat("the value \"", text, "\" would end the call's text"));
      options.push_back(b_.literal(text));
    }
    if (options.empty()) fail(s.contains("const") ? "const" : "enum", ptr, cat("no value can be written as text: ", kTyped));
    return closed(b_.alt(options));
  }

  // The parameter's value and its closing tag.
  Frag value(const Json& s, const std::string& ptr) {
    c_.check(s, ptr);  // the JSON path's checks (keywords, $refs) whatever the form below
    if (s.is_boolean()) return raw_text();  // true: any value (false threw above)
    std::string type;
    bool nullable = false;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) type = t.get<std::string>();
      for (const Json& x : t.is_array() ? t : Json::array()) {
        if (x == "null") nullable = true;
        else if (type.empty()) type = x.get<std::string>();
      }
      if (type.empty()) type = "null";  // ["null"]
    }
    if (type == "null") return closed(b_.literal("null"));
    if (type.empty() || type == "string") {
      if (s.contains("enum") || s.contains("const")) return text_values(s, ptr, nullable);
      if (type.empty())
        for (const char* k : {"$ref", "anyOf", "oneOf", "properties", "required", "additionalProperties", "items",
                              "minItems", "maxItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
          if (s.contains(k)) fail(k, ptr, kTyped);
      for (const char* k : {"minLength", "maxLength", "format"})
        if (s.contains(k)) fail(k, ptr, "not enforced on a Qwen3-Coder text parameter (its value is raw text)");
      return raw_text();
    }
    return closed(b_.call(c_.rule_for(s, ptr)));  // JSON text, read back by its declared type
  }

  SchemaCompiler& c_;
  GrammarBuilder& b_;
  NodeId raw_rule_ = -1;
};

}  // namespace

Frag xml_call(SchemaCompiler& compiler, GrammarBuilder& b, const Json& tools) {
  if (!tools.is_array() || tools.empty()) throw SchemaError("", "", "a Qwen3-Coder call needs a list of tools");
  XmlCall x(compiler, b);
  std::vector<Frag> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string ptr = cat("/", i, "/parameters");
    try {
      calls.push_back(x.call(tools[i], cat("/", i)));
    } catch (const SchemaError& e) {  // named within the tool's own parameters, as its JSON check names them
      if (!e.pointer().starts_with(ptr)) throw;
      throw SchemaError(e.keyword(), e.pointer().substr(ptr.size()), e.why());
    }
  }
  return b.alt(calls);
}

}  // namespace megadecode::structured
