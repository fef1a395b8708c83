// Grammar pieces for JSON text shared by every spec kind: whitespace, strings (free or with a
// length range, or a format), numbers, integers (optionally in a range), any value.
// Each shared piece is one rule, built on first use, so its token sets are computed once.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "structured/grammar.h"

namespace megadecode::structured {

class JsonGrammar {
 public:
  JsonGrammar(GrammarBuilder& b, int max_whitespace) : b_(b), max_ws_(max_whitespace) {}

  GrammarBuilder& builder() { return b_; }
  Frag ws();                // up to max_whitespace bytes
  Frag ws(int max_bytes);   // up to max_bytes
  Frag string();            // any JSON string
  // max_chars < 0: no limit. Inline (not shared); the caller makes it the whole of a rule's value
  // (its closing quote ends the rule: the matcher's string token sets rely on it).
  Frag string(int min_chars, int max_chars);
  Frag formatted(const std::string& format);  // "date", "date-time", "uuid" (caller checks the name)
  // Numbers stay finite as doubles, so every reader (a JSON parser, a tool call's typed
  // parameter) reads them as numbers: an integer has at most 308 digits (< 1e308), a number's
  // integer part at most 208 and its exponent at most 2 digits (< 1e307). Fractions are free.
  static constexpr int kMaxIntegerDigits = 308, kMaxMantissaDigits = 208, kMaxExponentDigits = 2;
  Frag number();
  Frag integer();
  // Integers in [lo, hi]; an absent bound is open.
  Frag integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi);
  Frag any_value();
  Frag any_object();  // inline: `{` members `}` with any values
  // `open` items separated by ',' then `close`, the item count in [min_items, max_items]
  // (max_items < 0: no limit); item() builds one item's fragment.
  template <typename Item>
  Frag list(char open, char close, int min_items, int max_items, Item&& item);

 private:
  Frag string_char();
  Frag digits(int n);                           // exactly n digits
  Frag up_to_digits(int n);                     // 0 to n digits
  Frag fixed_range(const std::string& lo, const std::string& hi);  // same-length digit strings
  Frag non_negative_range(uint64_t lo, std::optional<uint64_t> hi);

  GrammarBuilder& b_;
  int max_ws_;
  std::map<int, NodeId> ws_rules_;
  NodeId string_rule_ = -1, number_rule_ = -1, integer_rule_ = -1, any_rule_ = -1;
};

template <typename Item>
Frag JsonGrammar::list(char open, char close, int min_items, int max_items, Item&& item) {
  const Frag head = b_.seq({b_.literal(std::string(1, open)), ws()});
  const NodeId done = b_.node();
  const char close_s[2] = {close, 0};
  if (min_items == 0) b_.eps(b_.seq({head, b_.literal(close_s)}).end, done);
  if (max_items == 0) return {head.begin, done};
  NodeId at = b_.seq({head, item()}).end;  // one item read
  for (int k = 1;; ++k) {
    if (k >= min_items) b_.eps(b_.seq({Frag{at, at}, ws(), b_.literal(close_s)}).end, done);
    if (max_items >= 0 && k == max_items) break;
    const Frag next = b_.seq({ws(), b_.literal(","), ws(), item()});
    b_.eps(at, next.begin);
    if (max_items < 0 && k >= min_items) {  // no limit: loop
      b_.eps(next.end, at);
      break;
    }
    at = next.end;
  }
  return {head.begin, done};
}

}  // namespace megadecode::structured
