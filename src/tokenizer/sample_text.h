// Synthetic text for the tokenizer's conformance tests, fuzzers and benchmark, and the corpus the
// synthetic North tokenizer (north_synthetic.h, which make-model writes) grows its merges from: deterministic
// from a seed, covering what tokenizers get wrong — source code, CJK, emoji sequences, combining
// marks (NFC reordering and composition), RTL and Indic scripts, whitespace runs, numbers,
// contractions, embedded special tokens, very long words and random code points.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"

namespace megadecode::sample_text {

enum class Kind {
  kProse,          // English, French, German, Russian, Greek sentences
  kCode,           // C++, Python, JavaScript, Rust, Go, SQL, HTML, shell, JSON
  kCjk,            // Chinese, Japanese, Korean, fullwidth forms
  kEmoji,          // ZWJ sequences, skin tones, flags, keycaps, tags
  kCombining,      // base letters with combining marks, Hangul jamo, singletons
  kScripts,        // Arabic, Hebrew, Devanagari, Bengali, Thai, Sinhala, Tamil
  kWhitespace,     // runs of spaces, tabs, newlines, CRLF and Unicode spaces
  kNumbers,        // digits of many lengths, other number characters
  kContractions,   // 's 't 're 've 'm 'll 'd in any case
  kSpecialTokens,  // <|im_start|>, <think>, ... embedded in text, and near-misses
  kLongWords,      // words of hundreds to thousands of characters
  kRandom,         // random code points from every plane, controls included
};
inline constexpr int kNumKinds = 12;

const char* kind_name(Kind kind);

// One sample of the given kind.
std::string generate(Kind kind, SplitMix64& rng);

// n_per_kind samples of every kind, plus fixed edge cases (the empty string first).
std::vector<std::string> corpus(uint64_t seed, int n_per_kind);

// About n_bytes of mixed text (mostly prose and code, some of every kind but kLongWords), for
// benchmarks.
std::string mixed_text(uint64_t seed, size_t n_bytes);

// About n_bytes of samples of one kind, separated by spaces.
std::string text_of_kind(Kind kind, uint64_t seed, size_t n_bytes);

}  // namespace megadecode::sample_text
