// The JSON Schema compiler behind build_grammar (schema.h), for the structured room's own
// grammars that hold JSON values inside another syntax (xml_call.h): value() and rule_for() give a
// sub-schema's JSON grammar, its local "$ref"s resolved against the root the compiler was made with.
// Throws SchemaError naming the keyword and its JSON pointer. Threading: one compile at a time.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "structured/grammar.h"
#include "structured/json_grammar.h"
#include "structured/schema.h"

namespace megadecode::structured {

using Json = nlohmann::ordered_json;

// A JSON pointer's reference token ("~" -> "~0", "/" -> "~1").
std::string escape_pointer_token(const std::string& s);

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, GrammarBuilder& b, const Options& options)
      : root_(root), b_(b), options_(options), json_(b, options.max_whitespace) {}

  Frag value(const Json& s, const std::string& ptr);
  // One rule a JSON pointer: a schema reached twice (a $ref, a shared definition) is built once.
  NodeId rule_for(const Json& s, const std::string& ptr);
  // rule_for's checks (every keyword, the $refs) without a rule in this grammar: for a caller that
  // writes the sub-schema's values in a form of its own.
  void check(const Json& s, const std::string& ptr) const;
  JsonGrammar& json() { return json_; }

 private:
  [[noreturn]] void fail(const std::string& keyword, const std::string& ptr, const std::string& why) const {
    throw SchemaError(keyword, ptr + "/" + escape_pointer_token(keyword), why);
  }
  int count(const Json& s, const std::string& key, const std::string& ptr, int fallback) const;
  std::optional<int64_t> bound(const Json& s, const std::string& key, const std::string& ptr) const;
  const Json& resolve(const std::string& ref, const std::string& ptr, std::string& target_ptr) const;
  Frag typed(const std::string& type, const Json& s, const std::string& ptr);
  Frag object(const Json& s, const std::string& ptr);
  Frag array(const Json& s, const std::string& ptr);
  Frag string(const Json& s, const std::string& ptr);
  Frag integer(const Json& s, const std::string& ptr);
  Frag enumeration(const std::vector<Json>& values);
  void check_disjoint(const Json& branches, const std::string& ptr) const;

  const Json& root_;
  GrammarBuilder& b_;
  Options options_;
  JsonGrammar json_;
  std::map<std::string, NodeId> rules_;  // by JSON pointer
};

}  // namespace megadecode::structured
