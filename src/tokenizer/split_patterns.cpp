// Leftmost-first matching of the split patterns of split_patterns.h: each alternative tried in
// order, and within one, the greedy choices a backtracking engine tries first.
#include "tokenizer/split_patterns.h"

#include <cstdint>

#include "core/check.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace megadecode {
namespace {

using unicode::kLetter;
using unicode::kLetterOther;
using unicode::kLower;
using unicode::kMark;
using unicode::kNumber;
using unicode::kSpace;
using unicode::kUpper;

constexpr uint8_t kUpperSide = kUpper | kLetterOther | kMark;  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
constexpr uint8_t kLowerSide = kLower | kLetterOther | kMark;  // [\p{Ll}\p{Lm}\p{Lo}\p{M}]

constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kDigitGroupsRegex = R"(\d{1,3}(?=(?:\d{3})*\b))";
constexpr std::string_view kGpt4oRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// The same pattern as tiktoken's o200k writes it, with (?i:'s|'t|'re|'ve|'m|'ll|'d)? contractions.
constexpr std::string_view kGpt4oRegexTiktoken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Char {
  size_t len;    // bytes
  uint8_t cls;   // unicode::CharClass bits
  bool newline;  // \r or \n
};

class Cursor {
 public:
  explicit Cursor(std::string_view s) : s_(s) {}

  size_t size() const { return s_.size(); }
  char byte(size_t i) const { return s_[i]; }

  Char at(size_t i) const {
    const auto b = static_cast<uint8_t>(s_[i]);
    if (b < 0x80) return Char{1, kAscii.cls[b], b == '\r' || b == '\n'};
    char32_t cp;
    const size_t n = utf8::decode_one(s_, i, &cp);
    MD_CHECK(n != 0, "split patterns need valid UTF-8");
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

  // [^\s\p{L}\p{N}]
  static bool is_other(const Char& c) { return (c.cls & (kLetter | kNumber | kSpace)) == 0; }

  // End of the run of is_other characters starting at i.
  size_t other_run_end(size_t i) const {
    while (i < s_.size() && is_other(at(i))) i += at(i).len;
    return i;
  }

  // Length of the contraction '(s|t|re|ve|m|ll|d) at i, 0 if none; ASCII letters of either case
  // when any_case, else lower case only.
  size_t contraction(size_t i, bool any_case) const {
    if (i + 1 >= s_.size() || s_[i] != '\'') return 0;
    auto low = [&](size_t k) { return any_case ? lower(s_[k]) : s_[k]; };
    const char a = low(i + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= s_.size()) return 0;
    const char b = low(i + 2);
    return (a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l') ? 3 : 0;
  }

  // The three whitespace alternatives shared by the patterns, at i (a \s character):
  // \s*[\r\n]+ (when with_newlines) | \s+(?!\S) | \s+
  size_t whitespace(size_t i, bool with_newlines) const {
    const size_t n = s_.size();
    size_t end = i, last_newline = n, last_start = i;
    while (end < n) {
      const Char c = at(end);
      if (!(c.cls & kSpace)) break;
      if (c.newline) last_newline = end;
      last_start = end;
      end += c.len;
    }
    if (with_newlines && last_newline != n) return last_newline + 1 - i;  // up to the last newline
    if (end == n) return end - i;              // the whole run at the end of text
    if (last_start > i) return last_start - i;  // all but its last character
    return end - i;                            // a single whitespace character
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

const Cursor::AsciiTable Cursor::kAscii;

// ` ?X` where X is the other-run: the start of X (after an optional space), or i.
size_t after_optional_space(const Cursor& m, size_t i, bool (*accept)(const Char&)) {
  if (m.byte(i) == ' ' && i + 1 < m.size() && accept(m.at(i + 1))) return i + 1;
  return i;
}

size_t match_qwen2(const Cursor& m, size_t i) {
  const size_t n = m.size();
  if (const size_t c = m.contraction(i, /*any_case=*/true)) return c;
  const Char c0 = m.at(i);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (!c0.newline && !(c0.cls & (kLetter | kNumber)) && i + c0.len < n && (m.at(i + c0.len).cls & kLetter)) {
    return m.run_end(i + c0.len, kLetter) - i;
  }
  if (c0.cls & kLetter) return m.run_end(i, kLetter) - i;
  if (c0.cls & kNumber) return c0.len;  // \p{N}
  // ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t j = after_optional_space(m, i, Cursor::is_other);
  if (Cursor::is_other(m.at(j))) {
    j = m.other_run_end(j);
    while (j < n && (m.byte(j) == '\r' || m.byte(j) == '\n')) ++j;
    return j - i;
  }
  MD_CHECK(c0.cls & kSpace);
  return m.whitespace(i, /*with_newlines=*/true);
}

size_t match_gpt2(const Cursor& m, size_t i) {
  if (const size_t c = m.contraction(i, /*any_case=*/false)) return c;
  auto letter = [](const Char& c) { return (c.cls & kLetter) != 0; };
  auto number = [](const Char& c) { return (c.cls & kNumber) != 0; };
  size_t j = after_optional_space(m, i, letter);  // ?\p{L}+
  if (letter(m.at(j))) return m.run_end(j, kLetter) - i;
  j = after_optional_space(m, i, number);  // ?\p{N}+
  if (number(m.at(j))) return m.run_end(j, kNumber) - i;
  j = after_optional_space(m, i, Cursor::is_other);  // ?[^\s\p{L}\p{N}]+
  if (Cursor::is_other(m.at(j))) return m.other_run_end(j) - i;
  MD_CHECK(m.at(i).cls & kSpace);
  return m.whitespace(i, /*with_newlines=*/false);
}

// The letter alternatives of the GPT-4o pattern from j (after the optional prefix); the end of
// the match, or 0 when it fails. upper_first: A+B*C, else A*B+C.
size_t gpt4o_letters(const Cursor& m, size_t j, bool upper_first) {
  size_t k = j, last_lower_side = m.size(), last_len = 0;  // the last B character inside the A run
  while (k < m.size()) {
    const Char c = m.at(k);
    if (!(c.cls & kUpperSide)) break;
    if (c.cls & kLowerSide) {
      last_lower_side = k;
      last_len = c.len;
    }
    k += c.len;
  }
  size_t end;
  if (upper_first) {
    if (k == j) return 0;
    end = m.run_end(k, kLowerSide);
  } else if (k < m.size() && (m.at(k).cls & kLowerSide)) {
    end = m.run_end(k, kLowerSide);
  } else if (last_lower_side != m.size()) {
    // A* gives back characters until B+ can take one: the last B character of the A run (the
    // ones after it are not B, so B+ ends right after it).
    end = last_lower_side + last_len;
  } else {
    return 0;
  }
  return end + m.contraction(end, /*any_case=*/true);
}

size_t match_gpt4o(const Cursor& m, size_t i) {
  const Char c0 = m.at(i);
  const bool prefix = !c0.newline && !(c0.cls & (kLetter | kNumber));  // [^\r\n\p{L}\p{N}]
  for (const bool upper_first : {false, true}) {
    if (prefix && i + c0.len < m.size()) {
      if (const size_t end = gpt4o_letters(m, i + c0.len, upper_first)) return end - i;
    }
    if (const size_t end = gpt4o_letters(m, i, upper_first)) return end - i;
  }
  if (c0.cls & kNumber) {  // \p{N}{1,3}
    size_t j = i;
    for (int k = 0; k < 3 && j < m.size() && (m.at(j).cls & kNumber); ++k) j += m.at(j).len;
    return j - i;
  }
  size_t j = after_optional_space(m, i, Cursor::is_other);  // ?[^\s\p{L}\p{N}]+[\r\n/]*
  if (Cursor::is_other(m.at(j))) {
    j = m.other_run_end(j);
    while (j < m.size() && (m.byte(j) == '\r' || m.byte(j) == '\n' || m.byte(j) == '/')) ++j;
    return j - i;
  }
  MD_CHECK(c0.cls & kSpace);
  return m.whitespace(i, /*with_newlines=*/true);
}

bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ascii_word(char c) {
  return is_ascii_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

// \d{1,3}(?=(?:\d{3})*\b): from a digit at p in a run of ASCII digits ending at e, the lookahead
// holds after p+k only when e - (p+k) is a multiple of 3 and e is a word boundary (the byte after
// the run is not an ASCII word character); greedy \d{1,3} takes the largest such k.
size_t find_digit_groups(std::string_view s, size_t from, size_t* start) {
  size_t p = from;
  while (p < s.size()) {
    if (!is_ascii_digit(s[p])) {
      ++p;
      continue;
    }
    size_t e = p;
    while (e < s.size() && is_ascii_digit(s[e])) ++e;
    if (e == s.size() || !is_ascii_word(s[e])) {
      *start = p;
      return (e - p - 1) % 3 + 1;
    }
    p = e;  // no position of this run can match
  }
  return 0;
}

// The pieces of a pattern that matches at every position, with its matcher inlined in the loop.
template <size_t (*match)(const Cursor&, size_t)>
void every_position_pieces(std::string_view text, std::vector<std::string_view>& pieces) {
  const Cursor m(text);
  for (size_t i = 0; i < text.size();) {
    const size_t len = match(m, i);
    MD_CHECK(len > 0 && i + len <= text.size());
    pieces.push_back(text.substr(i, len));
    i += len;
  }
}

}  // namespace

void split_pattern_pieces(SplitPattern pattern, std::string_view text, std::vector<std::string_view>& pieces) {
  switch (pattern) {
    case SplitPattern::kQwen2: return every_position_pieces<match_qwen2>(text, pieces);
    case SplitPattern::kGpt2: return every_position_pieces<match_gpt2>(text, pieces);
    case SplitPattern::kGpt4o: return every_position_pieces<match_gpt4o>(text, pieces);
    case SplitPattern::kDigitGroups: break;
  }
  size_t prev = 0, start = 0;
  for (size_t len; prev < text.size() && (len = find_digit_groups(text, prev, &start)) != 0;) {
    if (prev < start) pieces.push_back(text.substr(prev, start - prev));
    pieces.push_back(text.substr(start, len));
    prev = start + len;
  }
  if (prev < text.size()) pieces.push_back(text.substr(prev));
}

std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex) {
  if (regex == kGpt4oRegexTiktoken) return SplitPattern::kGpt4o;
  for (const SplitPattern p : {SplitPattern::kQwen2, SplitPattern::kGpt2, SplitPattern::kDigitGroups, SplitPattern::kGpt4o}) {
    if (regex == split_pattern_regex(p)) return p;
  }
  return std::nullopt;
}

std::string_view split_pattern_regex(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kQwen2: return kQwen2Regex;
    case SplitPattern::kGpt2: return kGpt2Regex;
    case SplitPattern::kDigitGroups: return kDigitGroupsRegex;
    case SplitPattern::kGpt4o: return kGpt4oRegex;
  }
  MD_CHECK(false, "unknown split pattern");
  return {};
}

size_t split_pattern_find(SplitPattern pattern, std::string_view text, size_t from, size_t* start) {
  if (from >= text.size()) return 0;
  if (pattern == SplitPattern::kDigitGroups) return find_digit_groups(text, from, start);
  // The other patterns match at every position (every character is a letter, number, space or
  // other), so the leftmost match starts at `from`.
  const Cursor m(text);
  *start = from;
  switch (pattern) {
    case SplitPattern::kQwen2: return match_qwen2(m, from);
    case SplitPattern::kGpt2: return match_gpt2(m, from);
    case SplitPattern::kGpt4o: return match_gpt4o(m, from);
    case SplitPattern::kDigitGroups: break;
  }
  MD_CHECK(false, "unknown split pattern");
  return 0;
}

}  // namespace megadecode
