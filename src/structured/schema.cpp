// JSON Schema -> Grammar. Supported: type (one or a list), properties, required,
// additionalProperties (false when absent, as in strict mode; true or a schema), enum, const,
// items, minItems, maxItems, anyOf, oneOf whose branches have distinct primitive types, $ref to
// this document ("#", "#/$defs/...", "#/definitions/...", any local JSON pointer; recursion
// allowed), minLength, maxLength, format (date, date-time, uuid), integer minimum, maximum,
// exclusiveMinimum, exclusiveMaximum. Annotations are ignored; every other keyword is a
// SchemaError naming it and its JSON pointer.
#include "structured/schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "structured/json_grammar.h"
#include "structured/schema_compiler.h"
#include "structured/regex.h"
#include "structured/xml_call.h"

namespace megadecode::structured {

SchemaError::SchemaError(std::string keyword, std::string pointer, const std::string& why)
    : Error(cat("JSON schema: \"", keyword, "\" at #", pointer, ": ", why)),
      keyword_(std::move(keyword)),
      pointer_(std::move(pointer)),
      why_(why) {}

namespace {

constexpr int kMaxCounted = 512;  // the largest minLength/maxLength/minItems/maxItems compiled

const std::set<std::string> kAnnotations = {"title", "description", "examples", "default", "$schema", "$id",
                                            "$comment", "deprecated", "readOnly", "writeOnly"};
const std::set<std::string> kSupported = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                          "items", "minItems", "maxItems", "anyOf", "oneOf", "$ref", "$defs",
                                          "definitions", "minLength", "maxLength", "format", "minimum", "maximum",
                                          "exclusiveMinimum", "exclusiveMaximum"};
const std::set<std::string> kTypes = {"object", "array", "string", "integer", "number", "boolean", "null"};

std::string json_type(const Json& v) {
  if (v.is_object()) return "object";
  if (v.is_array()) return "array";
  if (v.is_string()) return "string";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number_float()) return std::floor(v.get<double>()) == v.get<double>() ? "integer" : "number";
  if (v.is_boolean()) return "boolean";
  return "null";
}

}  // namespace

std::string escape_pointer_token(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

NodeId SchemaCompiler::rule_for(const Json& s, const std::string& ptr) {
  const auto it = rules_.find(ptr);
  if (it != rules_.end()) return it->second;
  const NodeId rule = b_.rule();
  rules_[ptr] = rule;
  b_.define(rule, value(s, ptr));
  return rule;
}

void SchemaCompiler::check(const Json& s, const std::string& ptr) const {
  GrammarBuilder scratch;
  SchemaCompiler c(root_, scratch, options_);
  (void)c.rule_for(s, ptr);
}

int SchemaCompiler::count(const Json& s, const std::string& key, const std::string& ptr, int fallback) const {
  if (!s.contains(key)) return fallback;
  const Json& v = s[key];
  if (!v.is_number_integer() && !v.is_number_unsigned()) fail(key, ptr, "must be a non-negative integer");
  if (v.get<int64_t>() < 0) fail(key, ptr, "must be a non-negative integer");
  if (v.get<int64_t>() > kMaxCounted) fail(key, ptr, cat("values above ", kMaxCounted, " are not supported"));
  return static_cast<int>(v.get<int64_t>());
}

std::optional<int64_t> SchemaCompiler::bound(const Json& s, const std::string& key, const std::string& ptr) const {
  if (!s.contains(key)) return std::nullopt;
  const Json& v = s[key];
  if (!v.is_number()) fail(key, ptr, "must be a number");
  const double d = v.get<double>();
  if (!(std::fabs(d) < 9e18)) fail(key, ptr, "out of range");
  const bool exclusive = key.starts_with("exclusive");
  const bool lower = key == "minimum" || key == "exclusiveMinimum";
  // The tightest integer bound: ceil for a lower bound, floor for an upper one.
  const double r = lower ? std::ceil(d) : std::floor(d);
  int64_t b = static_cast<int64_t>(r);
  if (exclusive && r == d) b += lower ? 1 : -1;
  return b;
}

const Json& SchemaCompiler::resolve(const std::string& ref, const std::string& ptr, std::string& target_ptr) const {
  if (ref.empty() || ref[0] != '#') fail("$ref", ptr, cat("only references within the schema (\"#...\") are supported, not \"", ref, "\""));
  target_ptr = ref.substr(1);
  try {
    const Json::json_pointer jp(target_ptr);
    if (!root_.contains(jp)) fail("$ref", ptr, cat("\"", ref, "\" names nothing in the schema"));
    return root_.at(jp);
  } catch (const nlohmann::json::exception&) {
    fail("$ref", ptr, cat("\"", ref, "\" is not a JSON pointer"));
  }
}

Frag SchemaCompiler::enumeration(const std::vector<Json>& values) {
  std::vector<Frag> options;
  for (const Json& v : values) options.push_back(b_.literal(v.dump()));
  return b_.alt(options);
}

void SchemaCompiler::check_disjoint(const Json& branches, const std::string& ptr) const {
  std::set<std::string> seen;
  for (const Json& br : branches) {
    const bool ok = br.is_object() && br.contains("type") && br["type"].is_string() && !br.contains("enum") &&
                    !br.contains("const");
    const std::string t = ok ? br["type"].get<std::string>() : "";
    if (!ok || !seen.insert(t).second)
      fail("oneOf", ptr, "only oneOf whose branches each have a different \"type\" is supported (use anyOf)");
  }
  if (seen.count("integer") && seen.count("number")) fail("oneOf", ptr, "integer and number branches overlap");
}

Frag SchemaCompiler::value(const Json& s, const std::string& ptr) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) throw SchemaError("false", ptr, "the schema false allows nothing");
    return json_.any_value();
  }
  if (!s.is_object()) throw SchemaError("", ptr, "a schema must be an object or a boolean");
  for (const auto& [key, v] : s.items()) {
    if (kAnnotations.count(key) || kSupported.count(key)) continue;
    fail(key, ptr, "keyword not supported");
  }
  std::set<std::string> assertions;  // keywords present besides annotations and definitions
  for (const auto& [key, v] : s.items())
    if (kSupported.count(key) && key != "$defs" && key != "definitions") assertions.insert(key);

  if (s.contains("$ref")) {
    if (assertions.size() > 1) fail("$ref", ptr, "keywords beside $ref are not supported");
    if (!s["$ref"].is_string()) fail("$ref", ptr, "must be a string");
    std::string target;
    const Json& t = resolve(s["$ref"].get<std::string>(), ptr, target);
    return b_.call(rule_for(t, target));
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!s.contains(key)) continue;
    const Json& branches = s[key];
    if (!branches.is_array() || branches.empty()) fail(key, ptr, "must be a non-empty array");
    if (assertions.size() > 1) fail(key, ptr, "keywords beside anyOf/oneOf are not supported (move them into each branch)");
    if (std::string(key) == "oneOf") check_disjoint(branches, ptr);
    std::vector<Frag> options;
    for (size_t i = 0; i < branches.size(); ++i)
      options.push_back(b_.call(rule_for(branches[i], cat(ptr, "/", key, "/", i))));
    return b_.alt(options);
  }

  std::vector<std::string> types;
  if (s.contains("type")) {
    const Json& t = s["type"];
    if (t.is_string()) types.push_back(t.get<std::string>());
    else if (t.is_array())
      for (const Json& x : t) types.push_back(x.is_string() ? x.get<std::string>() : "");
    if (types.empty()) fail("type", ptr, "must be a type name or a non-empty list of them");
    for (const std::string& x : types)
      if (!kTypes.count(x)) fail("type", ptr, cat("unknown type \"", x, "\""));
  }
  if (s.contains("const") || s.contains("enum")) {
    std::vector<Json> values;
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) fail("enum", ptr, "must be a non-empty array");
      for (const Json& v : s["enum"]) values.push_back(v);
    }
    if (s.contains("const")) {
      if (s.contains("enum") && std::find(values.begin(), values.end(), s["const"]) == values.end())
        fail("const", ptr, "the value is not in enum");
      values = {s["const"]};
    }
    std::vector<Json> kept;
    for (const Json& v : values) {
      const std::string t = json_type(v);
      const bool typed_ok = types.empty() || std::find(types.begin(), types.end(), t) != types.end() ||
                            (t == "integer" && std::find(types.begin(), types.end(), "number") != types.end());
      if (typed_ok) kept.push_back(v);
    }
    if (kept.empty()) fail(s.contains("const") ? "const" : "enum", ptr, "no value satisfies the schema");
    for (const std::string& k : assertions)
      if (k != "const" && k != "enum" && k != "type") fail(k, ptr, "not supported beside enum/const");
    return enumeration(kept);
  }
  if (types.empty()) {  // inferred from the keywords present
    for (const std::string& k : assertions) {
      if (k == "properties" || k == "required" || k == "additionalProperties") types.push_back("object");
      else if (k == "items" || k == "minItems" || k == "maxItems") types.push_back("array");
      else if (k == "minLength" || k == "maxLength" || k == "format") types.push_back("string");
      else if (k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum") types.push_back("integer");
    }
    std::sort(types.begin(), types.end());
    types.erase(std::unique(types.begin(), types.end()), types.end());
    if (types.size() > 1) fail(*assertions.begin(), ptr, "keywords of several types without \"type\"");
    if (types.empty()) return json_.any_value();
  }
  std::vector<Frag> options;
  for (const std::string& t : types) options.push_back(typed(t, s, ptr));
  return b_.alt(options);
}

Frag SchemaCompiler::typed(const std::string& type, const Json& s, const std::string& ptr) {
  if (type == "object") return object(s, ptr);
  if (type == "array") return array(s, ptr);
  if (type == "string") return string(s, ptr);
  if (type == "integer") return integer(s, ptr);
  if (type == "number") {
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (s.contains(k)) fail(k, ptr, "bounds on type number are not supported (integer bounds are)");
    return json_.number();
  }
  if (type == "boolean") return b_.alt({b_.literal("true"), b_.literal("false")});
  return b_.literal("null");
}

Frag SchemaCompiler::object(const Json& s, const std::string& ptr) {
  static const Json kEmpty = Json::object();
  const Json& props = s.contains("properties") ? s["properties"] : kEmpty;
  if (!props.is_object()) fail("properties", ptr, "must be an object");
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) fail("required", ptr, "must be an array of names");
    for (const Json& r : s["required"]) {
      if (!r.is_string()) fail("required", ptr, "must be an array of names");
      if (!props.contains(r.get<std::string>()))
        fail("required", ptr, cat("\"", r.get<std::string>(), "\" is not in properties"));
      required.insert(r.get<std::string>());
    }
  }
  const Json* extra = nullptr;  // schema of additional properties
  std::string extra_ptr = ptr + "/additionalProperties";
  if (s.contains("additionalProperties")) {
    const Json& a = s["additionalProperties"];
    if (!a.is_boolean() && !a.is_object()) fail("additionalProperties", ptr, "must be a boolean or a schema");
    if (!(a.is_boolean() && !a.get<bool>())) extra = &a;
  }
  // Two tracks over the properties in order: A_i (none written yet) and B_i (some written).
  const Frag open = b_.seq({b_.literal("{"), json_.ws()});
  NodeId a = open.end, bnode = b_.node();
  auto pair = [&](const std::string& name, NodeId value_rule) {
    return b_.seq({b_.literal(Json(name).dump()), json_.ws(), b_.literal(":"), json_.ws(), b_.call(value_rule)});
  };
  for (const auto& [name, sub] : props.items()) {
    const NodeId rule = rule_for(sub, ptr + "/properties/" + escape_pointer_token(name));
    const NodeId a_next = b_.node(), b_next = b_.node();
    b_.eps(b_.seq({Frag{a, a}, pair(name, rule)}).end, b_next);
    b_.eps(b_.seq({Frag{bnode, bnode}, json_.ws(), b_.literal(","), json_.ws(), pair(name, rule)}).end, b_next);
    if (!required.count(name)) {
      b_.eps(a, a_next);
      b_.eps(bnode, b_next);
    }
    a = a_next;
    bnode = b_next;
  }
  if (extra) {
    const NodeId rule = rule_for(*extra, extra_ptr);
    auto extra_pair = [&] {
      return b_.seq({json_.string(), json_.ws(), b_.literal(":"), json_.ws(), b_.call(rule)});
    };
    b_.eps(b_.seq({Frag{a, a}, extra_pair()}).end, bnode);
    b_.eps(b_.seq({Frag{bnode, bnode}, json_.ws(), b_.literal(","), json_.ws(), extra_pair()}).end, bnode);
  }
  const NodeId done = b_.node();
  b_.eps(b_.seq({Frag{a, a}, b_.literal("}")}).end, done);
  b_.eps(b_.seq({Frag{bnode, bnode}, json_.ws(), b_.literal("}")}).end, done);
  return {open.begin, done};
}

Frag SchemaCompiler::array(const Json& s, const std::string& ptr) {
  const int min_items = count(s, "minItems", ptr, 0);
  const int max_items = count(s, "maxItems", ptr, -1);
  if (max_items >= 0 && max_items < min_items) fail("maxItems", ptr, "is below minItems");
  NodeId rule = -1;
  if (s.contains("items")) {
    const Json& items = s["items"];
    if (items.is_array()) fail("items", ptr, "a list of item schemas (tuple form) is not supported");
    rule = rule_for(items, ptr + "/items");
  }
  return json_.list('[', ']', min_items, max_items, [&] { return rule >= 0 ? b_.call(rule) : json_.any_value(); });
}

Frag SchemaCompiler::string(const Json& s, const std::string& ptr) {
  if (s.contains("format")) {
    const Json& f = s["format"];
    const std::string name = f.is_string() ? f.get<std::string>() : "";
    if (name != "date" && name != "date-time" && name != "uuid")
      fail("format", ptr, cat("format \"", name, "\" is not supported (date, date-time, uuid are)"));
    for (const char* k : {"minLength", "maxLength"})
      if (s.contains(k)) fail(k, ptr, "not supported together with format");
    return json_.formatted(name);
  }
  const int min_len = count(s, "minLength", ptr, 0);
  const int max_len = count(s, "maxLength", ptr, -1);
  if (max_len >= 0 && max_len < min_len) fail("maxLength", ptr, "is below minLength");
  if (min_len == 0 && max_len < 0) return json_.string();
  return json_.string(min_len, max_len);
}

Frag SchemaCompiler::integer(const Json& s, const std::string& ptr) {
  std::optional<int64_t> lo, hi;
  for (const char* k : {"minimum", "exclusiveMinimum"}) {
    const auto v = bound(s, k, ptr);
    if (v && (!lo || *v > *lo)) lo = v;
  }
  for (const char* k : {"maximum", "exclusiveMaximum"}) {
    const auto v = bound(s, k, ptr);
    if (v && (!hi || *v < *hi)) hi = v;
  }
  if (lo && hi && *lo > *hi) fail(s.contains("maximum") ? "maximum" : "exclusiveMaximum", ptr, "no integer is in range");
  return json_.integer_range(lo, hi);
}

Spec Spec::json_schema(std::string schema_text, Options options) {
  Spec s;
  s.kind = SpecKind::kJsonSchema;
  s.schema = std::move(schema_text);
  s.options = options;
  return s;
}

Spec Spec::json_object(Options options) {
  Spec s;
  s.kind = SpecKind::kJsonObject;
  s.options = options;
  return s;
}

Spec Spec::choice(std::vector<std::string> choices, Options options) {
  Spec s;
  s.kind = SpecKind::kChoice;
  s.choices = std::move(choices);
  s.options = options;
  return s;
}

Spec Spec::xml_call(std::string tools_text) {
  Spec s;
  s.kind = SpecKind::kXmlCall;
  s.schema = std::move(tools_text);
  return s;
}

Spec Spec::regex(std::string pattern) {
  Spec s;
  s.kind = SpecKind::kRegex;
  s.pattern = std::move(pattern);
  return s;
}

std::string Spec::cache_key() const {
  std::string key = cat(static_cast<int>(kind), ":", options.max_whitespace, ":", options.leading_whitespace, ":",
                        options.trailing_whitespace, ":");
  if (kind == SpecKind::kJsonSchema || kind == SpecKind::kXmlCall) key += schema;
  if (kind == SpecKind::kChoice)
    for (const std::string& c : choices) key += cat(c.size(), ":", c);
  if (kind == SpecKind::kRegex) key += pattern;
  return key;
}

Grammar build_grammar(const Spec& spec) {
  GrammarBuilder b;
  const NodeId root = b.rule();
  if (spec.kind == SpecKind::kChoice) {
    MD_REQUIRE(!spec.choices.empty(), "choice: the list of choices is empty");
    std::vector<Frag> options;
    for (const std::string& c : spec.choices) {
      MD_REQUIRE(!c.empty(), "choice: an empty choice");
      options.push_back(b.literal(c));
    }
    b.define(root, b.alt(options));
    return b.finish(root);
  }
  if (spec.kind == SpecKind::kRegex) {
    b.define(root, regex_fragment(b, spec.pattern));
    return b.finish(root);
  }
  Json schema;
  if (spec.kind == SpecKind::kJsonSchema || spec.kind == SpecKind::kXmlCall) {
    try {
      schema = Json::parse(spec.schema);
    } catch (const nlohmann::json::exception& e) {
      throw SchemaError("", "", cat("the schema is not valid JSON (", e.what(), ")"));
    }
  }
  SchemaCompiler compiler(schema, b, spec.options);
  if (spec.kind == SpecKind::kXmlCall) {
    b.define(root, xml_call(compiler, b, schema));
    return b.finish(root);
  }
  const Frag lead = compiler.json().ws(spec.options.leading_whitespace);
  const Frag body = spec.kind == SpecKind::kJsonObject ? compiler.json().any_object()
                                                        : b.call(compiler.rule_for(schema, ""));
  const Frag trail = compiler.json().ws(spec.options.trailing_whitespace);
  b.define(root, b.seq({lead, body, trail}));
  return b.finish(root);
}

}  // namespace megadecode::structured
