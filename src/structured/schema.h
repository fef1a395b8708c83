// What a request may constrain its output to, and the compilers from each kind to a Grammar:
// a JSON Schema (the subset in the README's "Structured output" section), any JSON object
// (JSON mode), one of a list of literal strings (choice), a regular expression (regex.h), or a
// Qwen3-Coder tool call, XML around JSON values (xml_call.h).
//
// Whitespace: every structural gap (after '{' and '[', around ':' and ',', before '}' and ']')
// takes at most Options::max_whitespace bytes of ' ', '\n' or '\t' (0: compact JSON only); the
// output may start with at most Options::leading_whitespace such bytes and end with at most
// Options::trailing_whitespace. Objects list their properties in the schema's order.
#pragma once

#include <string>
#include <vector>

#include "core/check.h"
#include "structured/grammar.h"

namespace megadecode::structured {

// A schema the engine cannot enforce: the keyword and its JSON pointer (e.g. "/properties/a/pattern";
// "" is the root), for an HTTP 400.
class SchemaError : public Error {
 public:
  SchemaError(std::string keyword, std::string pointer, const std::string& why);
  const std::string& keyword() const { return keyword_; }
  const std::string& pointer() const { return pointer_; }
  const std::string& why() const { return why_; }

 private:
  std::string keyword_, pointer_, why_;
};

struct Options {
  int max_whitespace = 1;      // bytes of whitespace at each structural gap
  int leading_whitespace = 0;   // bytes of whitespace before the value
  int trailing_whitespace = 0;  // and after it (e.g. "\n" before Qwen3's "</tool_call>")
  bool operator==(const Options&) const = default;
};

enum class SpecKind { kJsonSchema, kJsonObject, kChoice, kRegex, kXmlCall };

struct Spec {
  SpecKind kind = SpecKind::kJsonObject;
  std::string schema;                // kJsonSchema: the schema's JSON text; kXmlCall: the tools (xml_call.h)
  std::vector<std::string> choices;  // kChoice: the output is exactly one of these
  std::string pattern;               // kRegex: the output matches it whole (regex.h's subset)
  Options options;

  static Spec json_schema(std::string schema_text, Options options = {});
  static Spec json_object(Options options = {});
  static Spec choice(std::vector<std::string> choices, Options options = {});
  static Spec regex(std::string pattern);
  // Qwen3-Coder's XML tool call over tools_text, a JSON array of {"name", "parameters"} whose local
  // "$ref"s point from the array's root ("#/0/parameters/$defs/x"): xml_call.h.
  static Spec xml_call(std::string tools_text);
  std::string cache_key() const;
};

// Throws SchemaError (unsupported or malformed schema) or Error (bad choice list or regex).
Grammar build_grammar(const Spec& spec);

}  // namespace megadecode::structured
