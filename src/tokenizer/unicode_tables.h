// Unicode data the tokenizer needs, generated from Node's Unicode tables by
// scripts/gen_unicode_tables.mjs (so classification and NFC match the JavaScript reference):
// the \p{L}, \p{N}, \s, letter-case and \p{M} classes of the split patterns, and NFC normalization data.
// All arrays are sorted by their first field.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megadecode::unicode {

struct CodeRange {
  char32_t lo, hi;  // inclusive
};
struct CccEntry {
  char32_t cp;
  uint8_t rank;  // orders like the canonical combining class; 0 (absent) = starter
};
struct Decomposition {
  char32_t cp;
  uint32_t offset, length;  // full canonical decomposition: kDecompositionData[offset, offset+length)
};
struct Composition {
  char32_t first, second, composite;  // primary composite pairs, excluding Hangul
};

extern const char kUnicodeVersion[];
extern const CodeRange kLetterRanges[];
extern const size_t kLetterRanges_count;
extern const CodeRange kNumberRanges[];
extern const size_t kNumberRanges_count;
extern const CodeRange kSpaceRanges[];  // JavaScript's \s (differs from White_Space: +U+FEFF, -U+0085)
extern const size_t kSpaceRanges_count;
extern const CodeRange kUpperRanges[];        // \p{Lu} and \p{Lt}
extern const size_t kUpperRanges_count;
extern const CodeRange kLowerRanges[];        // \p{Ll}
extern const size_t kLowerRanges_count;
extern const CodeRange kLetterOtherRanges[];  // \p{Lm} and \p{Lo}
extern const size_t kLetterOtherRanges_count;
extern const CodeRange kMarkRanges[];         // \p{M}
extern const size_t kMarkRanges_count;
extern const CccEntry kCccRanks[];
extern const size_t kCccRanks_count;
extern const char32_t kDecompositionData[];
extern const size_t kDecompositionData_count;
extern const Decomposition kDecompositions[];
extern const size_t kDecompositions_count;
extern const Composition kCompositions[];
extern const size_t kCompositions_count;
extern const char32_t kQuickCheckNo[];     // NFC_Quick_Check = No
extern const size_t kQuickCheckNo_count;
extern const char32_t kQuickCheckMaybe[];  // NFC_Quick_Check = Maybe (can compose with a predecessor)
extern const size_t kQuickCheckMaybe_count;

}  // namespace megadecode::unicode
