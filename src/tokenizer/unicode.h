// Unicode services for the tokenizer, backed by the generated tables in unicode_tables.cpp:
// the character classes of the pre-tokenizer regex (\p{L}, \p{N}, JavaScript's \s) and NFC
// normalization (the normalizer Qwen's tokenizer.json names).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace megadecode::unicode {

enum CharClass : uint8_t {
  kOther = 0,
  kLetter = 1,  // \p{L}
  kNumber = 2,  // \p{N}
  kSpace = 4,   // \s as JavaScript defines it
  // Subclasses for GPT-4o-style patterns; every letter has exactly one of the first three.
  kUpper = 8,         // \p{Lu} or \p{Lt}
  kLower = 16,        // \p{Ll}
  kLetterOther = 32,  // \p{Lm} or \p{Lo}
  kMark = 64,         // \p{M}
};

// Class of a code point; a table lookup for the BMP, a binary search above it.
uint8_t char_class(char32_t cp);

// Ordering rank of the canonical combining class (0 for starters).
uint8_t ccc_rank(char32_t cp);

// True when NFC certainly leaves s unchanged (the NFC_Quick_Check algorithm, answering YES).
// s must be valid UTF-8.
bool is_nfc_quick(std::string_view s);

// Unicode NFC of s (valid UTF-8): canonical decomposition, canonical ordering, composition.
std::string nfc(std::string_view s);

}  // namespace megadecode::unicode
