// Parsing the structured-output fields of a generation request (see structured_request.h).
#include "server/structured_request.h"

#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "server/api_error.h"

namespace megadecode {
namespace {

using json = RequestJson;

// A JSON Schema given as an object, or (structured_outputs / guided_json) as its JSON text. `what`
// names the value in the message, `param` is the request field a 400 names.
std::string schema_text(const json& v, const std::string& what, const std::string& param, bool text_allowed) {
  if (v.is_object()) return v.dump();
  if (text_allowed && v.is_string()) {
    const json parsed = json::parse(v.get<std::string>(), nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object())
      throw bad_request(cat("'", what, "' must be a JSON Schema: an object, or its JSON text"), param);
    return parsed.dump();
  }
  throw bad_request(cat("'", what, "' must be a JSON Schema object"), param);
}

std::vector<std::string> choices(const json& v, const std::string& what, const std::string& param) {
  if (!v.is_array() || v.empty()) throw bad_request(cat("'", what, "' must be a non-empty list of strings"), param);
  std::vector<std::string> out;
  for (const json& c : v) {
    if (!c.is_string()) throw bad_request(cat("'", what, "' must be a non-empty list of strings"), param);
    out.push_back(c.get<std::string>());
  }
  return out;
}

std::string string_of(const json& v, const std::string& what, const std::string& param) {
  if (!v.is_string()) throw bad_request(cat("'", what, "' must be a string"), param);
  return v.get<std::string>();
}

std::optional<StructuredOutput> from_response_format(const json& v) {
  const std::string field = "response_format";
  if (!v.is_object()) throw bad_request("'response_format' must be an object", field);
  const json* type = request_field(v, "type");
  if (type == nullptr || !type->is_string())
    throw bad_request("'response_format' needs a 'type': \"text\", \"json_object\" or \"json_schema\"", field);
  const std::string t = type->get<std::string>();
  if (t == "text") return std::nullopt;
  if (t == "json_object") return StructuredOutput{structured::Spec::json_object(), field};
  if (t != "json_schema")
    throw bad_request(cat("'response_format' of type ", t, " is not supported: use \"text\", \"json_object\" or "
                          "\"json_schema\""),
                      field);
  const json* js = request_field(v, "json_schema");
  if (js == nullptr || !js->is_object())
    throw bad_request("'response_format' of type json_schema needs a 'json_schema' object", field);
  if (const json* name = request_field(*js, "name"); name != nullptr && !name->is_string())
    throw bad_request("'response_format.json_schema.name' must be a string", field);
  if (const json* strict = request_field(*js, "strict"); strict != nullptr && !strict->is_boolean())
    throw bad_request("'response_format.json_schema.strict' must be a boolean", field);
  const json* schema = request_field(*js, "schema");
  if (schema == nullptr) throw bad_request("'response_format.json_schema' needs a 'schema'", field);
  return StructuredOutput{structured::Spec::json_schema(schema_text(*schema, "response_format.json_schema.schema", field, false)),
                          field};
}

std::optional<StructuredOutput> from_structured_outputs(const json& v) {
  const std::string field = "structured_outputs";
  if (!v.is_object()) throw bad_request("'structured_outputs' must be an object", field);
  for (const char* refused : {"grammar", "structural_tag"})
    if (request_field(v, refused) != nullptr)
      throw bad_request(cat("'structured_outputs.", refused, "' is not supported by this server (json, regex, choice "
                            "and json_object are)"),
                        field);
  std::optional<StructuredOutput> out;
  auto take = [&](structured::Spec spec) {
    if (out) throw bad_request("'structured_outputs' takes exactly one of json, regex, choice and json_object", field);
    out = StructuredOutput{std::move(spec), field};
  };
  if (const json* j = request_field(v, "json")) take(structured::Spec::json_schema(schema_text(*j, field + ".json", field, true)));
  if (const json* re = request_field(v, "regex")) take(structured::Spec::regex(string_of(*re, field + ".regex", field)));
  if (const json* c = request_field(v, "choice")) take(structured::Spec::choice(choices(*c, field + ".choice", field)));
  if (const json* jo = request_field(v, "json_object")) {
    if (!jo->is_boolean()) throw bad_request("'structured_outputs.json_object' must be a boolean", field);
    if (jo->get<bool>()) take(structured::Spec::json_object());
  }
  if (!out) throw bad_request("'structured_outputs' takes exactly one of json, regex, choice and json_object", field);
  return out;
}

}  // namespace

std::optional<StructuredOutput> parse_structured_output(const RequestJson& body) {
  // (An empty object or list asks for nothing, as vLLM reads them.)
  auto field = [&](const char* name) -> const json* {
    const json* v = request_field(body, name);
    return v == nullptr || ((v->is_object() || v->is_array()) && v->empty()) ? nullptr : v;
  };
  std::vector<StructuredOutput> asked;
  if (const json* v = request_field(body, "response_format"))
    if (auto s = from_response_format(*v)) asked.push_back(std::move(*s));
  if (const json* v = field("structured_outputs")) asked.push_back(*from_structured_outputs(*v));
  if (const json* v = field("guided_json"))
    asked.push_back({structured::Spec::json_schema(schema_text(*v, "guided_json", "guided_json", true)), "guided_json"});
  if (const json* v = field("guided_regex"))
    asked.push_back({structured::Spec::regex(string_of(*v, "guided_regex", "guided_regex")), "guided_regex"});
  if (const json* v = field("guided_choice"))
    asked.push_back({structured::Spec::choice(choices(*v, "guided_choice", "guided_choice")), "guided_choice"});
  if (asked.size() > 1)
    throw bad_request(cat("'", asked[0].field, "' and '", asked[1].field,
                          "' both ask for structured output: give one of them"),
                      asked[1].field);
  if (asked.empty()) return std::nullopt;
  return std::move(asked[0]);
}

}  // namespace megadecode
