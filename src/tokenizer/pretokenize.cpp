// Leftmost-first matching of the Qwen2 split pattern, one alternative after another, exactly as
// a backtracking regex engine tries them (see pretokenize.h for the pattern).
#include "tokenizer/pretokenize.h"

#include <cstdint>

#include "core/check.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace megadecode {
namespace {

using unicode::kLetter;
using unicode::kNumber;
using unicode::kSpace;

struct Char {
  size_t len;   // bytes
  uint8_t cls;  // unicode::CharClass bits
  bool newline; // \r or \n
};

class Matcher {
 public:
  explicit Matcher(std::string_view s) : s_(s) {}

  Char at(size_t i) const {
    const auto b = static_cast<uint8_t>(s_[i]);
    if (b < 0x80) return Char{1, kAscii.cls[b], b == '\r' || b == '\n'};
    char32_t cp;
    const size_t n = utf8::decode_one(s_, i, &cp);
    MD_CHECK(n != 0, "pretokenize needs valid UTF-8");
    return Char{n, unicode::char_class(cp), false};
  }

  // End of the run of characters starting at i whose class has any of `bits`.
  size_t run_end(size_t i, uint8_t bits) const {
    while (i < s_.size()) {
      const Char c = at(i);
      if (!(c.cls & bits)) break;
      i += c.len;
    }
    return i;
  }

  static bool is_other(const Char& c) { return (c.cls & (kLetter | kNumber | kSpace)) == 0; }

  // Length in bytes of the match at i (always >= 1).
  size_t match(size_t i) const {
    const size_t n = s_.size();
    // 1. Contractions: '(s|t|re|ve|m|ll|d), ASCII letters in either case.
    if (s_[i] == '\'' && i + 1 < n) {
      const char a = lower(s_[i + 1]);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
      if (i + 2 < n) {
        const char b = lower(s_[i + 2]);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
      }
    }
    const Char c0 = at(i);
    // 2. [^\r\n\p{L}\p{N}]?\p{L}+
    if (!c0.newline && !(c0.cls & (kLetter | kNumber)) && i + c0.len < n && (at(i + c0.len).cls & kLetter)) {
      return run_end(i + c0.len, kLetter) - i;
    }
    if (c0.cls & kLetter) return run_end(i, kLetter) - i;
    // 3. \p{N}: one character.
    if (c0.cls & kNumber) return c0.len;
    // 4.  ?[^\s\p{L}\p{N}]+[\r\n]*
    size_t j = i;
    if (s_[i] == ' ' && i + 1 < n && is_other(at(i + 1))) j = i + 1;
    if (is_other(at(j))) {
      while (j < n) {
        const Char c = at(j);
        if (!is_other(c)) break;
        j += c.len;
      }
      while (j < n && (s_[j] == '\r' || s_[j] == '\n')) ++j;
      return j - i;
    }
    // Only whitespace is left: c0 is \s.
    MD_CHECK(c0.cls & kSpace);
    size_t end = i, last_newline = n, last_start = i;
    while (end < n) {
      const Char c = at(end);
      if (!(c.cls & kSpace)) break;
      if (c.newline) last_newline = end;
      last_start = end;
      end += c.len;
    }
    // 5. \s*[\r\n]+ : up to the last newline of the whitespace run.
    if (last_newline != n) return last_newline + 1 - i;
    // 6. \s+(?!\S) : the whole run at the end of text, else all but its last character.
    if (end == n) return end - i;
    if (last_start > i) return last_start - i;
    // 7. \s+ : a single whitespace character before non-whitespace.
    return end - i;
  }

 private:
  static char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

  struct AsciiTable {
    uint8_t cls[128];
    AsciiTable() {
      for (int b = 0; b < 128; ++b) cls[b] = unicode::char_class(static_cast<char32_t>(b));
    }
  };
  static const AsciiTable kAscii;

  std::string_view s_;
};

const Matcher::AsciiTable Matcher::kAscii;

}  // namespace

void pretokenize(std::string_view text, std::vector<std::string_view>& pieces) {
  const Matcher m(text);
  size_t i = 0;
  while (i < text.size()) {
    const size_t len = m.match(i);
    MD_CHECK(len > 0 && i + len <= text.size());
    pieces.push_back(text.substr(i, len));
    i += len;
  }
}

}  // namespace megadecode
