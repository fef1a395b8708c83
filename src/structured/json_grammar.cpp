// JSON text as grammar fragments (RFC 8259), strings as valid UTF-8 with escapes that decode to
// scalar values (no lone surrogates), so every output parses with a strict JSON parser.
#include "structured/json_grammar.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace megadecode::structured {

Frag JsonGrammar::ws() { return ws(max_ws_); }

Frag JsonGrammar::ws(int max_bytes) {
  if (max_bytes <= 0) return b_.empty();
  auto [it, inserted] = ws_rules_.try_emplace(max_bytes, -1);
  if (inserted) {
    const NodeId rule = b_.rule();
    it->second = rule;
    const NodeId end = b_.node();
    NodeId at = b_.node();
    const NodeId begin = at;
    for (int k = 0; k < max_bytes; ++k) {
      const NodeId next = b_.node();
      for (const uint8_t c : {uint8_t{' '}, uint8_t{'\n'}, uint8_t{'\t'}}) b_.edge(at, c, c, next);
      b_.eps(at, end);
      at = next;
    }
    b_.eps(at, end);
    b_.define(rule, {begin, end});
  }
  return b_.call(it->second);
}

// One character of a string's body: unescaped ASCII, an escape, or a UTF-8 sequence.
Frag JsonGrammar::string_char() {
  const NodeId a = b_.node(), z = b_.node();
  b_.edge(a, 0x20, 0x21, z);
  b_.edge(a, 0x23, 0x5B, z);
  b_.edge(a, 0x5D, 0x7F, z);
  const NodeId c1 = b_.node(), c2 = b_.node(), c3 = b_.node();  // 1, 2, 3 continuation bytes to go
  b_.edge(c1, 0x80, 0xBF, z);
  b_.edge(c2, 0x80, 0xBF, c1);
  b_.edge(c3, 0x80, 0xBF, c2);
  b_.edge(a, 0xC2, 0xDF, c1);
  const NodeId e0 = b_.node(), ed = b_.node(), f0 = b_.node(), f4 = b_.node();
  b_.edge(a, 0xE0, 0xE0, e0);
  b_.edge(e0, 0xA0, 0xBF, c1);
  b_.edge(a, 0xE1, 0xEC, c2);
  b_.edge(a, 0xED, 0xED, ed);
  b_.edge(ed, 0x80, 0x9F, c1);
  b_.edge(a, 0xEE, 0xEF, c2);
  b_.edge(a, 0xF0, 0xF0, f0);
  b_.edge(f0, 0x90, 0xBF, c2);
  b_.edge(a, 0xF1, 0xF3, c3);
  b_.edge(a, 0xF4, 0xF4, f4);
  b_.edge(f4, 0x80, 0x8F, c2);
  const NodeId esc = b_.node();
  b_.edge(a, '\\', '\\', esc);
  for (const char c : std::string("\"\\/bfnrt")) b_.edge(esc, c, c, z);
  // \uXXXX without surrogates (D800-DFFF): raw UTF-8 covers the rest of the planes.
  const NodeId u = b_.node(), h3 = b_.node(), h2 = b_.node(), h1 = b_.node(), ud = b_.node();
  b_.edge(esc, 'u', 'u', u);
  for (NodeId from : {h1}) {
    b_.edge(from, '0', '9', z);
    b_.edge(from, 'a', 'f', z);
    b_.edge(from, 'A', 'F', z);
  }
  for (const auto& [from, to] : {std::pair{h3, h2}, std::pair{h2, h1}}) {
    b_.edge(from, '0', '9', to);
    b_.edge(from, 'a', 'f', to);
    b_.edge(from, 'A', 'F', to);
  }
  b_.edge(u, '0', '9', h3);
  b_.edge(u, 'a', 'c', h3);
  b_.edge(u, 'A', 'C', h3);
  b_.edge(u, 'e', 'f', h3);
  b_.edge(u, 'E', 'F', h3);
  b_.edge(u, 'd', 'd', ud);
  b_.edge(u, 'D', 'D', ud);
  b_.edge(ud, '0', '7', h2);
  return {a, z};
}

Frag JsonGrammar::string() {
  if (string_rule_ < 0) {
    string_rule_ = b_.rule();
    b_.define(string_rule_, string(0, -1));
  }
  return b_.call(string_rule_);
}

Frag JsonGrammar::string(int min_chars, int max_chars) {
  const Frag open = b_.literal("\"");
  const NodeId end = b_.node();
  NodeId at = open.end;
  for (int k = 0;; ++k) {
    if (k >= min_chars) b_.edge(at, '"', '"', end);
    if (max_chars >= 0 && k == max_chars) break;
    const Frag c = string_char();
    b_.mark_string_char(c.begin, std::max(min_chars - k, 0), max_chars < 0 ? -1 : max_chars - k);
    b_.eps(at, c.begin);
    if (max_chars < 0 && k == min_chars) {
      b_.eps(c.end, at);
      break;
    }
    at = c.end;
  }
  return {open.begin, end};
}

Frag JsonGrammar::digits(int n) {
  std::vector<Frag> parts;
  for (int i = 0; i < n; ++i) parts.push_back(b_.byte_range('0', '9'));
  return b_.seq(parts);
}

Frag JsonGrammar::up_to_digits(int n) {
  const NodeId begin = b_.node(), end = b_.node();
  NodeId at = begin;
  for (int i = 0; i < n; ++i) {
    b_.eps(at, end);
    const NodeId next = b_.node();
    b_.edge(at, '0', '9', next);
    at = next;
  }
  b_.eps(at, end);
  return {begin, end};
}

Frag JsonGrammar::formatted(const std::string& format) {
  auto two = [&](char lo0, char hi0, char lo1, char hi1) {
    return b_.seq({b_.byte_range(lo0, hi0), b_.byte_range(lo1, hi1)});
  };
  auto date = [&] {
    const Frag month = b_.alt({two('0', '0', '1', '9'), two('1', '1', '0', '2')});
    const Frag day = b_.alt({two('0', '0', '1', '9'), two('1', '2', '0', '9'), two('3', '3', '0', '1')});
    return b_.seq({digits(4), b_.literal("-"), month, b_.literal("-"), day});
  };
  auto hour = [&] { return b_.alt({two('0', '1', '0', '9'), two('2', '2', '0', '3')}); };
  auto minute = [&] { return two('0', '5', '0', '9'); };
  auto hex = [&](int n) {
    std::vector<Frag> parts;
    for (int i = 0; i < n; ++i) parts.push_back(b_.byte_ranges({{'0', '9'}, {'a', 'f'}, {'A', 'F'}}));
    return b_.seq(parts);
  };
  Frag body;
  if (format == "date") {
    body = date();
  } else if (format == "date-time") {
    const Frag fraction = b_.opt(b_.seq({b_.literal("."), b_.byte_range('0', '9'),
                                         b_.star(b_.byte_range('0', '9'))}));
    const Frag offset = b_.alt({b_.byte_ranges({{'Z', 'Z'}, {'z', 'z'}}),
                                b_.seq({b_.byte_ranges({{'+', '+'}, {'-', '-'}}), hour(), b_.literal(":"), minute()})});
    body = b_.seq({date(), b_.byte_ranges({{'T', 'T'}, {'t', 't'}}), hour(), b_.literal(":"), minute(), b_.literal(":"),
                   minute(), fraction, offset});
  } else {
    MD_CHECK(format == "uuid", format);
    body = b_.seq({hex(8), b_.literal("-"), hex(4), b_.literal("-"), hex(4), b_.literal("-"), hex(4), b_.literal("-"),
                   hex(12)});
  }
  return b_.seq({b_.literal("\""), body, b_.literal("\"")});
}

Frag JsonGrammar::integer() {
  if (integer_rule_ < 0) {
    integer_rule_ = b_.rule();
    const Frag magnitude = b_.alt({b_.literal("0"), b_.seq({b_.byte_range('1', '9'), up_to_digits(kMaxIntegerDigits - 1)})});
    b_.define(integer_rule_, b_.seq({b_.opt(b_.literal("-")), magnitude}));
  }
  return b_.call(integer_rule_);
}

Frag JsonGrammar::number() {
  if (number_rule_ < 0) {
    number_rule_ = b_.rule();
    const Frag magnitude = b_.alt({b_.literal("0"), b_.seq({b_.byte_range('1', '9'), up_to_digits(kMaxMantissaDigits - 1)})});
    const Frag fraction = b_.opt(b_.seq({b_.literal("."), b_.byte_range('0', '9'), b_.star(b_.byte_range('0', '9'))}));
    const Frag exponent = b_.opt(b_.seq({b_.byte_ranges({{'e', 'e'}, {'E', 'E'}}), b_.opt(b_.byte_ranges({{'+', '+'}, {'-', '-'}})),
                                         b_.byte_range('0', '9'), up_to_digits(kMaxExponentDigits - 1)}));
    b_.define(number_rule_, b_.seq({b_.opt(b_.literal("-")), magnitude, fraction, exponent}));
  }
  return b_.call(number_rule_);
}

// Digit strings of one length from lo to hi (lo <= hi, equal lengths): the usual split on the
// first digit.
Frag JsonGrammar::fixed_range(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return b_.empty();
  const char a = lo[0], z = hi[0];
  const std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
  if (a == z) return b_.seq({b_.byte_range(a, a), fixed_range(lo_rest, hi_rest)});
  const std::string nines(lo_rest.size(), '9'), zeros(lo_rest.size(), '0');
  std::vector<Frag> options;
  options.push_back(b_.seq({b_.byte_range(a, a), fixed_range(lo_rest, nines)}));
  if (a + 1 <= z - 1) options.push_back(b_.seq({b_.byte_range(a + 1, z - 1), digits(static_cast<int>(lo_rest.size()))}));
  options.push_back(b_.seq({b_.byte_range(z, z), fixed_range(zeros, hi_rest)}));
  return b_.alt(options);
}

// Decimal integers without leading zeros in [lo, hi] (no hi: no upper limit).
Frag JsonGrammar::non_negative_range(uint64_t lo, std::optional<uint64_t> hi) {
  const std::string los = std::to_string(lo);
  const size_t max_len = hi ? std::to_string(*hi).size() : los.size();
  std::vector<Frag> options;
  for (size_t len = los.size(); len <= max_len; ++len) {
    const std::string first = len == los.size() ? los : (len == 1 ? "0" : "1" + std::string(len - 1, '0'));
    const std::string last = hi && len == max_len ? std::to_string(*hi) : std::string(len, '9');
    options.push_back(fixed_range(first, last));
  }
  if (!hi) {  // every longer number
    const int len = static_cast<int>(los.size());  // at most 20 < kMaxIntegerDigits
    options.push_back(b_.seq({b_.byte_range('1', '9'), digits(len), up_to_digits(kMaxIntegerDigits - 1 - len)}));
  }
  return b_.alt(options);
}

Frag JsonGrammar::integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (!lo && !hi) return integer();
  auto magnitude = [](int64_t v) { return v < 0 ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v); };
  std::vector<Frag> options;
  if (!hi || *hi >= 0) {  // the non-negative part
    const uint64_t from = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    options.push_back(non_negative_range(from, hi ? std::optional<uint64_t>(static_cast<uint64_t>(*hi)) : std::nullopt));
  }
  if (!lo || *lo < 0) {  // the negative part: '-' and magnitudes in [max(1, -hi), -lo]
    const uint64_t from = hi && *hi < 0 ? magnitude(*hi) : 1;
    options.push_back(b_.seq({b_.literal("-"),
                              non_negative_range(from, lo ? std::optional<uint64_t>(magnitude(*lo)) : std::nullopt)}));
  }
  return b_.alt(options);
}

Frag JsonGrammar::any_value() {
  if (any_rule_ < 0) {
    any_rule_ = b_.rule();
    const Frag array = list('[', ']', 0, -1, [&] { return b_.call(any_rule_); });
    b_.define(any_rule_, b_.alt({string(), number(), b_.literal("true"), b_.literal("false"), b_.literal("null"),
                                 any_object(), array}));
  }
  return b_.call(any_rule_);
}

Frag JsonGrammar::any_object() {
  return list('{', '}', 0, -1, [&] { return b_.seq({string(), ws(), b_.literal(":"), ws(), any_value()}); });
}

}  // namespace megadecode::structured
