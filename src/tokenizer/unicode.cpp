// Character classes and NFC normalization from the generated Unicode tables. The BMP gets flat
// lookup tables (built once, 192 KiB) because the pre-tokenizer classifies every character.
#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "tokenizer/unicode_tables.h"
#include "tokenizer/utf8.h"

namespace megadecode::unicode {
namespace {

// Hangul syllable arithmetic (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr char32_t kSCount = kLCount * kNCount;

enum NfcFlag : uint8_t { kQcNo = 1, kQcMaybe = 2 };

bool in_ranges(const CodeRange* ranges, size_t n, char32_t cp) {
  const CodeRange* end = ranges + n;
  const CodeRange* it = std::upper_bound(ranges, end, cp, [](char32_t c, const CodeRange& r) { return c < r.lo; });
  return it != ranges && cp <= (it - 1)->hi;
}

bool in_sorted(const char32_t* values, size_t n, char32_t cp) { return std::binary_search(values, values + n, cp); }

uint8_t ccc_search(char32_t cp) {
  const CccEntry* end = kCccRanks + kCccRanks_count;
  const CccEntry* it = std::lower_bound(kCccRanks, end, cp, [](const CccEntry& e, char32_t c) { return e.cp < c; });
  return (it != end && it->cp == cp) ? it->rank : 0;
}

uint8_t class_search(char32_t cp) {
  uint8_t c = kOther;
  if (in_ranges(kLetterRanges, kLetterRanges_count, cp)) c |= kLetter;
  if (in_ranges(kNumberRanges, kNumberRanges_count, cp)) c |= kNumber;
  if (in_ranges(kSpaceRanges, kSpaceRanges_count, cp)) c |= kSpace;
  if (in_ranges(kUpperRanges, kUpperRanges_count, cp)) c |= kUpper;
  if (in_ranges(kLowerRanges, kLowerRanges_count, cp)) c |= kLower;
  if (in_ranges(kLetterOtherRanges, kLetterOtherRanges_count, cp)) c |= kLetterOther;
  if (in_ranges(kMarkRanges, kMarkRanges_count, cp)) c |= kMark;
  return c;
}

uint8_t nfc_flags_search(char32_t cp) {
  uint8_t f = 0;
  if (in_sorted(kQuickCheckNo, kQuickCheckNo_count, cp)) f |= kQcNo;
  if (in_sorted(kQuickCheckMaybe, kQuickCheckMaybe_count, cp)) f |= kQcMaybe;
  return f;
}

struct BmpTables {
  std::array<uint8_t, 0x10000> char_class;
  std::array<uint8_t, 0x10000> ccc;
  std::array<uint8_t, 0x10000> nfc_flags;
  BmpTables() {
    for (char32_t cp = 0; cp < 0x10000; ++cp) {
      char_class[cp] = class_search(cp);
      ccc[cp] = ccc_search(cp);
      nfc_flags[cp] = nfc_flags_search(cp);
    }
  }
};

const BmpTables& bmp() {
  static const auto tables = std::make_unique<BmpTables>();
  return *tables;
}

uint8_t nfc_flags(char32_t cp) { return cp < 0x10000 ? bmp().nfc_flags[cp] : nfc_flags_search(cp); }

// Appends the full canonical decomposition of cp.
void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* end = kDecompositions + kDecompositions_count;
  const Decomposition* it =
      std::lower_bound(kDecompositions, end, cp, [](const Decomposition& d, char32_t c) { return d.cp < c; });
  if (it != end && it->cp == cp) {
    out.insert(out.end(), kDecompositionData + it->offset, kDecompositionData + it->offset + it->length);
  } else {
    out.push_back(cp);
  }
}

// The primary composite of (first, second), or 0 if there is none.
char32_t compose(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase && second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 && second > kTBase &&
      second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  static const std::unordered_map<uint64_t, char32_t> pairs = [] {
    std::unordered_map<uint64_t, char32_t> map;
    for (size_t i = 0; i < kCompositions_count; ++i) {
      const Composition& c = kCompositions[i];
      map.emplace((static_cast<uint64_t>(c.first) << 21) | c.second, c.composite);
    }
    return map;
  }();
  auto it = pairs.find((static_cast<uint64_t>(first) << 21) | second);
  return it == pairs.end() ? 0 : it->second;
}

// NFC of one chunk: canonical decomposition, canonical ordering, canonical composition.
std::string nfc_chunk(std::string_view s) {
  // 1. Full canonical decomposition.
  std::vector<char32_t> chars;  // [n code points]
  chars.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const size_t n = utf8::decode_one(s, i, &cp);
    MD_CHECK(n != 0, "nfc needs valid UTF-8");
    i += n;
    decompose(cp, chars);
  }
  // 2. Canonical ordering: stable sort of every run of non-starters by combining class.
  for (size_t i = 0; i < chars.size();) {
    if (ccc_rank(chars[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < chars.size() && ccc_rank(chars[j]) != 0) ++j;
    std::stable_sort(chars.begin() + static_cast<ptrdiff_t>(i), chars.begin() + static_cast<ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return ccc_rank(a) < ccc_rank(b); });
    i = j;
  }
  // 3. Canonical composition: each character composes with the last starter unless blocked
  //    (a character between them has class 0 or a class >= its own).
  std::vector<char32_t> out;  // [<= n code points]
  out.reserve(chars.size());
  ptrdiff_t starter = -1;  // index in out of the last starter
  uint8_t last_ccc = 0;    // class of the last character appended after that starter
  for (const char32_t c : chars) {
    const uint8_t ccc = ccc_rank(c);
    if (starter >= 0) {
      const bool adjacent = static_cast<ptrdiff_t>(out.size()) == starter + 1;
      if (adjacent || (last_ccc != 0 && last_ccc < ccc)) {
        const char32_t composite = compose(out[static_cast<size_t>(starter)], c);
        if (composite != 0) {
          out[static_cast<size_t>(starter)] = composite;
          continue;
        }
      }
    }
    if (ccc == 0) {
      starter = static_cast<ptrdiff_t>(out.size());
      last_ccc = 0;
    } else {
      last_ccc = ccc;
    }
    out.push_back(c);
  }
  std::string result;
  result.reserve(s.size());
  for (const char32_t c : out) utf8::append(result, c);
  return result;
}

}  // namespace

uint8_t char_class(char32_t cp) { return cp < 0x10000 ? bmp().char_class[cp] : class_search(cp); }

uint8_t ccc_rank(char32_t cp) { return cp < 0x10000 ? bmp().ccc[cp] : ccc_search(cp); }

bool is_nfc_quick(std::string_view s) {
  uint8_t last_ccc = 0;
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0xCC) {  // below U+0300: always NFC_QC=Yes, ccc 0
      last_ccc = 0;
      ++i;
      continue;
    }
    char32_t cp;
    const size_t n = utf8::decode_one(s, i, &cp);
    MD_CHECK(n != 0, "is_nfc_quick needs valid UTF-8");
    i += n;
    const uint8_t ccc = ccc_rank(cp);
    if (ccc != 0 && last_ccc > ccc) return false;
    if (nfc_flags(cp) != 0) return false;
    last_ccc = ccc;
  }
  return true;
}

namespace {

// A starter with NFC_Quick_Check=Yes: NFC neither reorders nor composes across its start.
bool is_stable(char32_t cp) { return cp < 0x300 || (ccc_rank(cp) == 0 && nfc_flags(cp) == 0); }

}  // namespace

std::string nfc(std::string_view s) {
  // NFC never looks across a "stable" character (class 0, quick-check Yes): nothing before it
  // reorders past it or composes with what follows it. Normalize only the chunks between stable
  // characters that contain an unstable one; copy the rest.
  std::string out;
  out.reserve(s.size());
  size_t copied = 0;       // s[0, copied) is already in out
  size_t last_stable = 0;  // start of the last stable character seen (a chunk may start there)
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    const size_t n = utf8::decode_one(s, i, &cp);
    MD_CHECK(n != 0, "nfc needs valid UTF-8");
    if (is_stable(cp)) {
      last_stable = i;
      i += n;
      continue;
    }
    // An unstable character: the chunk runs from the last stable character to the next one.
    size_t end = i + n;
    while (end < s.size()) {
      char32_t c;
      const size_t m = utf8::decode_one(s, end, &c);
      MD_CHECK(m != 0, "nfc needs valid UTF-8");
      if (is_stable(c)) break;
      end += m;
    }
    const size_t start = std::max(last_stable, copied);
    out.append(s.data() + copied, start - copied);
    out += nfc_chunk(s.substr(start, end - start));
    copied = end;
    last_stable = end;
    i = end;
  }
  out.append(s.data() + copied, s.size() - copied);
  return out;
}

}  // namespace megadecode::unicode
