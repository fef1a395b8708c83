// UTF-8 validation and lossy conversion (maximal-subpart U+FFFD substitution).
#include "tokenizer/utf8.h"

namespace megadecode::utf8 {
namespace {

struct Prefix {
  size_t valid;     // bytes at s[i..] that are a valid prefix of some sequence (0 = bad lead)
  size_t expected;  // length of the full sequence its lead byte announces
};

// How far s[i..] goes as a prefix of a well-formed sequence (Unicode Table 3-7).
Prefix valid_prefix(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {1, 1};
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0, 1};
  }
  size_t k = 1;
  while (k < n && i + k < s.size()) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b & 0xC0) == 0x80;
    if (!ok) break;
    ++k;
  }
  return {k, n};
}

}  // namespace

size_t find_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    char32_t cp;
    const size_t n = decode_one(s, i, &cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

size_t invalid_subpart_length(std::string_view s, size_t i) {
  const Prefix p = valid_prefix(s, i);
  return p.valid == 0 ? 1 : p.valid;
}

void append_lossy(std::string& out, std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    while (i < s.size() && static_cast<uint8_t>(s[i]) < 0x80) ++i;  // ASCII run
    out.append(s.data() + start, i - start);
    if (i == s.size()) break;
    char32_t cp;
    const size_t n = decode_one(s, i, &cp);
    if (n != 0) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      append(out, kReplacement);
      i += invalid_subpart_length(s, i);
    }
  }
}

size_t incomplete_tail_length(std::string_view s) {
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const size_t i = s.size() - k;
    const auto b = static_cast<uint8_t>(s[i]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: the lead is further back
    const Prefix p = valid_prefix(s, i);
    return (p.valid == k && p.expected > k) ? k : 0;
  }
  return 0;
}

}  // namespace megadecode::utf8
