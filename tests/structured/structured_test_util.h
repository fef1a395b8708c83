// Shared helpers of the structured-output tests: a synthetic vocabulary with awkward merges and
// special tokens, a JSON Schema validator for the supported subset (the oracle), a generator of
// random schemas of that subset, and a random walk that samples among the allowed tokens.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "structured/compiler.h"

namespace megadecode::structured::testing {

using Json = nlohmann::ordered_json;

// n tokens: the 256 single bytes, JSON-flavoured merges (structure, digits, words, UTF-8, pieces
// of UTF-8 characters), then 3 special tokens; the last special is the end token.
inline Vocabulary synthetic_vocab(uint64_t seed, int n) {
  SplitMix64 rng(seed);
  std::vector<std::string> bytes;
  std::vector<bool> text;
  for (int b = 0; b < 256; ++b) {
    bytes.push_back(std::string(1, static_cast<char>(b)));
    text.push_back(true);
  }
  const std::vector<std::string> pieces = {"\"", "\"", "{", "}", "[", "]", ":", ",", " ", "\n", "\t", "\\", "\\u",
                                           "00", "0", "1", "7", "9", "-", ".", "e", "+", "a", "b", "c", "x", "Z",
                                           "true", "false", "null", "name", "id", "é", "中", "😀", "\xE4", "\xB8",
                                           "\xF0\x9F", "T", "Z", "2024-", "12", "-0", "ab", "\\n", "\\\""};
  const std::vector<std::string> specials = {"<think>", "<|im_start|>", "<|endoftext|>"};
  while (static_cast<int>(bytes.size()) < n - static_cast<int>(specials.size())) {
    std::string s;
    const int k = 2 + static_cast<int>(rng.below(4));
    for (int i = 0; i < k; ++i) s += pieces[rng.below(pieces.size())];
    bytes.push_back(s);
    text.push_back(true);
  }
  for (const std::string& s : specials) {
    bytes.push_back(s);
    text.push_back(false);
  }
  return Vocabulary(std::move(bytes), std::move(text), {n - 1});
}

// The 256 single bytes and an end token (256): outputs fed byte by byte.
inline Vocabulary byte_vocab() {
  std::vector<std::string> bytes;
  std::vector<bool> text;
  for (int b = 0; b < 256; ++b) {
    bytes.push_back(std::string(1, static_cast<char>(b)));
    text.push_back(true);
  }
  bytes.push_back("<eos>");
  text.push_back(false);
  return Vocabulary(std::move(bytes), std::move(text), {256});
}

// Validates `v` against `schema` (the supported subset; `root` resolves $ref). Returns "" or why not.
inline std::string validate(const Json& v, const Json& schema, const Json& root) {
  if (schema.is_boolean()) return schema.get<bool>() ? "" : "schema false";
  const Json& s = schema;
  if (s.contains("$ref")) return validate(v, root.at(Json::json_pointer(s["$ref"].get<std::string>().substr(1))), root);
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!s.contains(key)) continue;
    int n_ok = 0;
    for (const Json& br : s[key]) n_ok += validate(v, br, root).empty();
    if (n_ok == 0) return std::string(key) + ": no branch matches " + v.dump();
    if (std::string(key) == "oneOf" && n_ok > 1) return "oneOf: several branches match";
    return "";
  }
  if (s.contains("const") && v != s["const"]) return "const: " + v.dump();
  if (s.contains("enum")) {
    bool found = false;
    for (const Json& e : s["enum"]) found = found || e == v;
    if (!found) return "enum: " + v.dump();
  }
  if (s.contains("type")) {
    std::vector<std::string> types;
    if (s["type"].is_string()) types.push_back(s["type"]);
    else
      for (const Json& t : s["type"]) types.push_back(t);
    bool ok = false;
    for (const std::string& t : types) {
      ok = ok || (t == "object" && v.is_object()) || (t == "array" && v.is_array()) || (t == "string" && v.is_string()) ||
           (t == "integer" && v.is_number() && std::floor(v.get<double>()) == v.get<double>()) || (t == "number" && v.is_number()) ||
           (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null());
    }
    if (!ok) return "type: " + v.dump() + " is not " + s["type"].dump();
  }
  if (s.contains("const") || s.contains("enum")) return "";  // the value is one of the listed ones
  if (v.is_object()) {
    if (s.contains("required"))
      for (const Json& r : s["required"])
        if (!v.contains(r.get<std::string>())) return "required: " + r.get<std::string>() + " missing";
    for (const auto& [k, x] : v.items()) {
      if (s.contains("properties") && s["properties"].contains(k)) {
        if (std::string why = validate(x, s["properties"][k], root); !why.empty()) return k + ": " + why;
      } else if (!s.contains("additionalProperties") ||
                 (s["additionalProperties"].is_boolean() && !s["additionalProperties"].get<bool>())) {
        return "additional property " + k;  // strict: absent additionalProperties is false
      } else if (std::string why = validate(x, s["additionalProperties"], root); !why.empty()) {
        return k + ": " + why;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return "minItems";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return "maxItems";
    if (s.contains("items"))
      for (const Json& x : v)
        if (std::string why = validate(x, s["items"], root); !why.empty()) return "item: " + why;
  }
  if (v.is_string()) {
    const std::string& str = v.get_ref<const std::string&>();
    size_t n_chars = 0;
    for (const char c : str) n_chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    if (s.contains("minLength") && n_chars < s["minLength"].get<size_t>()) return "minLength: " + v.dump();
    if (s.contains("maxLength") && n_chars > s["maxLength"].get<size_t>()) return "maxLength: " + v.dump();
    if (s.contains("format")) {
      static const std::regex date(R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))");
      static const std::regex date_time(
          R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt]([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d))");
      static const std::regex uuid(R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})");
      const std::string f = s["format"];
      const std::regex& re = f == "date" ? date : f == "uuid" ? uuid : date_time;
      if (!std::regex_match(str, re)) return "format " + f + ": " + str;
    }
  }
  if (v.is_number()) {
    const double d = v.get<double>();
    if (s.contains("minimum") && d < s["minimum"].get<double>()) return "minimum: " + v.dump();
    if (s.contains("maximum") && d > s["maximum"].get<double>()) return "maximum: " + v.dump();
    if (s.contains("exclusiveMinimum") && d <= s["exclusiveMinimum"].get<double>()) return "exclusiveMinimum";
    if (s.contains("exclusiveMaximum") && d >= s["exclusiveMaximum"].get<double>()) return "exclusiveMaximum";
  }
  return "";
}

// Random schemas of the supported subset (depth-limited; $defs with a recursive list).
class SchemaGenerator {
 public:
  explicit SchemaGenerator(uint64_t seed) : rng_(seed) {}

  Json schema() {
    Json root = node(0);
    if (rng_.below(4) == 0) {  // a recursive definition and a reference to it
      Json def = {{"type", "object"},
                  {"properties", {{"v", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}},
                                  {"next", {{"anyOf", {{{"$ref", "#/$defs/list"}}, {{"type", "null"}}}}}}}},
                  {"required", {"v", "next"}}};
      root = {{"type", "object"},
              {"properties", {{"head", {{"$ref", "#/$defs/list"}}}, {"other", root}}},
              {"required", {"head"}},
              {"$defs", {{"list", def}}}};
    }
    return root;
  }

 private:
  int pick(int n) { return static_cast<int>(rng_.below(static_cast<uint64_t>(n))); }
  std::string word() {
    static const std::vector<std::string> words = {"a", "id", "name", "x y", "é", "q\"uote", "back\\slash", "n1", "tags", "v"};
    return words[pick(static_cast<int>(words.size()))];
  }

  Json node(int depth) {
    const int kind = depth >= 3 ? pick(7) : pick(13);
    switch (kind) {
      case 0: {
        Json s = {{"type", "string"}};
        if (pick(2)) s["maxLength"] = pick(6);
        if (pick(2)) s["minLength"] = pick(3);
        if (s.contains("maxLength") && s.contains("minLength") && s["minLength"] > s["maxLength"]) s.erase("minLength");
        return s;
      }
      case 1: {
        Json s = {{"type", "integer"}};
        const int64_t lo = pick(200) - 100;
        if (pick(2)) s["minimum"] = lo;
        if (pick(2)) s["maximum"] = lo + pick(300);
        if (pick(4) == 0) s["exclusiveMaximum"] = lo + 1 + pick(50);
        return s;
      }
      case 2: return {{"type", "number"}};
      case 3: return {{"type", pick(2) ? "boolean" : "null"}};
      case 4: {
        Json e = Json::array();
        for (int i = 0, n = 1 + pick(4); i < n; ++i) {
          const int k = pick(3);
          e.push_back(k == 0 ? Json(word()) : k == 1 ? Json(pick(100) - 50) : Json(nullptr));
        }
        return {{"enum", e}};
      }
      case 5: return {{"const", pick(2) ? Json(word()) : Json({{"k", pick(9)}})}};
      case 6: {
        static const std::vector<std::string> formats = {"date", "date-time", "uuid"};
        return {{"type", "string"}, {"format", formats[pick(3)]}};
      }
      case 7:
      case 8:
      case 9: {
        Json s = {{"type", "object"}, {"properties", Json::object()}};
        Json required = Json::array();
        for (int i = 0, n = pick(5); i < n; ++i) {
          const std::string name = word() + std::to_string(i);
          s["properties"][name] = node(depth + 1);
          if (pick(2)) required.push_back(name);
        }
        if (!required.empty()) s["required"] = required;
        const int extra = pick(6);
        if (extra == 0) s["additionalProperties"] = true;
        if (extra == 1) s["additionalProperties"] = node(depth + 2);
        if (extra == 2) s["additionalProperties"] = false;
        return s;
      }
      case 10: {
        Json s = {{"type", "array"}, {"items", node(depth + 1)}};
        if (pick(2)) s["minItems"] = pick(3);
        if (pick(2)) s["maxItems"] = s.value("minItems", 0) + pick(3);
        return s;
      }
      case 11: {
        Json s = {{"anyOf", Json::array()}};
        for (int i = 0, n = 2 + pick(2); i < n; ++i) s["anyOf"].push_back(node(depth + 1));
        return s;
      }
      default: {
        if (pick(2)) return {{"type", {"string", "null"}}, {"maxLength", 4}};
        return {{"oneOf", {{{"type", "integer"}}, {{"type", "string"}, {"maxLength", 3}}, {{"type", "boolean"}}}}};
      }
    }
  }

  SplitMix64 rng_;
};

// Samples among the allowed tokens until the constraint finishes or an end token is chosen;
// closing tokens (end, '"', '}', ']', and any token `extra_closers` names) grow likelier with the
// length so that walks complete.
struct Walk {
  std::string text;
  bool complete = false;  // ended by an end token or finished()
  int steps = 0;
  std::string error;      // an invariant that failed
};

inline bool bit(std::span<const uint32_t> words, int32_t t) { return (words[t >> 5] >> (t & 31)) & 1u; }

inline Walk random_walk(TokenConstraint& c, const Vocabulary& vocab, SplitMix64& rng, int max_steps,
                        const std::vector<std::string>& extra_closers = {}) {
  Walk w;
  std::vector<uint32_t> words(token_mask_words(vocab.size()) + 1);  // one spare word: must be zeroed
  std::vector<int32_t> allowed, closers;
  for (; w.steps < max_steps; ++w.steps) {
    if (c.finished()) {
      w.complete = true;
      return w;
    }
    words.back() = 0xDEADBEEF;
    c.fill_mask(words);
    if (words.back() != 0) w.error = "fill_mask left a spare word unwritten";
    allowed.clear();
    closers.clear();
    for (int32_t t = 0; t < vocab.size(); ++t) {
      if (!bit(words, t)) continue;
      allowed.push_back(t);
      const std::string& b = vocab.bytes(t);
      if (vocab.is_end(t) || b == "\"" || b == "}" || b == "]" ||
          std::find(extra_closers.begin(), extra_closers.end(), b) != extra_closers.end())
        closers.push_back(t);
    }
    const int32_t eos = vocab.end_ids()[0];
    if (bit(words, eos) != c.accepting() && !(allowed.size() == 1 && allowed[0] == eos))
      w.error = "the end token is allowed " + std::string(bit(words, eos) ? "" : "not ") + "where accepting() is " +
                (c.accepting() ? "true" : "false");
    if (allowed.empty()) {
      w.error = "empty mask";
      return w;
    }
    for (int32_t t = 0; t < vocab.size(); ++t)
      if (!vocab.is_text(t) && !vocab.is_end(t) && bit(words, t)) w.error = "a special token is allowed";
    const bool close = !closers.empty() && rng.below(100) < static_cast<uint64_t>(std::min(90, 10 + w.steps));
    const std::vector<int32_t>& from = close ? closers : allowed;
    const int32_t t = from[rng.below(from.size())];
    if (!c.accept(t)) {
      w.error = "accept() refused an allowed token " + std::to_string(t);
      return w;
    }
    if (vocab.is_end(t)) {
      w.complete = true;
      return w;
    }
    w.text += vocab.bytes(t);
  }
  w.complete = c.finished();
  return w;
}

}  // namespace megadecode::structured::testing
