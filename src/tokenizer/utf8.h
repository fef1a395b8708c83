// UTF-8 helpers for the tokenizer: strict decoding (encode rejects invalid input with the byte
// offset), encoding, and the lossy conversion decode() uses for byte sequences that tokens
// produce: each maximal invalid subpart becomes U+FFFD, as WHATWG TextDecoder, Rust's
// String::from_utf8_lossy and Python's errors="replace" all do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace megadecode::utf8 {

inline constexpr char32_t kReplacement = 0xFFFD;

// Length of the valid sequence starting at s[i] (1..4), or 0 if s[i..] does not start with one
// (invalid lead byte, bad continuation, overlong, surrogate, past U+10FFFF, or truncated).
// On success *cp receives the code point.
inline size_t decode_one(std::string_view s, size_t i, char32_t* cp) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t n;
  char32_t lo_second = 0x80, hi_second = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo_second = 0xA0;  // overlong
    if (b0 == 0xED) hi_second = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo_second = 0x90;  // overlong
    if (b0 == 0xF4) hi_second = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  const auto b1 = static_cast<uint8_t>(s[i + 1]);
  if (b1 < lo_second || b1 > hi_second) return 0;
  char32_t c = b0 & (0x7F >> n);
  c = (c << 6) | (b1 & 0x3F);
  for (size_t k = 2; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    c = (c << 6) | (b & 0x3F);
  }
  *cp = c;
  return n;
}

inline void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Offset of the first byte that does not begin a valid sequence, or npos if s is valid UTF-8.
size_t find_invalid(std::string_view s);

// Length of the maximal subpart at s[i] that must be replaced by one U+FFFD (s[i] does not start
// a valid sequence): the longest prefix of a valid sequence, at least 1 byte.
size_t invalid_subpart_length(std::string_view s, size_t i);

// Appends s to out, each maximal invalid subpart replaced by U+FFFD.
void append_lossy(std::string& out, std::string_view s);

// Length of the trailing bytes of s that form a truncated-but-so-far-valid sequence (0..3):
// bytes that later input could still complete into a character.
size_t incomplete_tail_length(std::string_view s);

}  // namespace megadecode::utf8
